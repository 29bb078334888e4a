#ifndef IDEMGATE_UTF8_H
#define IDEMGATE_UTF8_H

#include <stddef.h>

/* UTF-8, as Unicode Table 3-7 defines it: no overlong forms, no surrogates, nothing above
 * U+10FFFF. Pure. */

/* Length of the well-formed multi-byte sequence (2 to 4 bytes) at s, within avail bytes, or 0
 * when s does not start one (an ASCII byte is not a multi-byte sequence). */
size_t utf8_seq(const unsigned char *s, size_t avail);

/* 1 when s[0..n) is well-formed UTF-8 throughout (NUL bytes included as ASCII), else 0. */
int utf8_valid(const char *s, size_t n);

/* Shortens the NUL-terminated s in place so that it does not end inside a character (a text cut
 * at a byte count, by snprintf): the bytes of an unfinished last sequence go. */
void utf8_trim_cut(char *s);

/* A copy of the NUL-terminated s (malloc'd) in which every byte that starts no well-formed
 * sequence — a stray continuation byte, a sequence cut short (a text cut at a byte count), a
 * Latin-1 byte — is U+FFFD, the rest as it was. NULL when out of memory. */
char *utf8_repair(const char *s);

#endif
