"""Differential check of Retry-After HTTP-dates: src/backoff.c (through tool_retry_after) against
Python's email.utils, the reference parser.

    find CORPUS -type f | python3 diff_retry_after.py TOOL

Inputs: every corpus file (one header value each), and dates generated in all three RFC 9110
forms (IMF-fixdate, RFC 850, asctime) from 20,000 random instants in years 1601..9999, each also
with one byte changed. backoff.c reads IMF-fixdate and asctime values against now = 0000-01-01
(so the delay gives the exact instant), RFC 850 ones against now = 1970-01-01. Checks:
- every value backoff.c reads as a date, email.utils reads to the same instant (RFC 850: the
  same day, month, time and two-digit year; the century is backoff.c's 50-year window, which
  email.utils does not implement). Years below 100 are left out: email.utils takes "0067" for
  2067;
- every IMF-fixdate or asctime value that email.utils reads literally (written back in the same
  form it is the same text: no rolled-over 31 Nov or 25:00:00, which email.utils accepts and
  RFC 9110 does not) is read by backoff.c too.
Exits 1 on a difference, printing the first few.
"""
import email.utils
import random
import re
import subprocess
import sys
from datetime import datetime, timezone

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
LONG = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
IMF = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (%s) \d{4} \d\d:\d\d:\d\d GMT$" % "|".join(MONTHS))
ASC = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (%s) ( \d|\d\d) \d\d:\d\d:\d\d \d{4}$" % "|".join(MONTHS))
R850 = re.compile(r"^(%s), (\d\d)-(%s)-(\d\d) (\d\d):(\d\d):(\d\d) GMT$" % ("|".join(LONG), "|".join(MONTHS)))


YEAR0 = -62167219200  # 0000-01-01T00:00:00Z


def forms(t):
    d = datetime.fromtimestamp(t, timezone.utc)
    wd, mon = d.weekday(), MONTHS[d.month - 1]
    hms = d.strftime("%H:%M:%S")
    return [
        "%s, %02d %s %04d %s GMT" % (DAYS[wd], d.day, mon, d.year, hms),
        "%s, %02d-%s-%02d %s GMT" % (LONG[wd], d.day, mon, d.year % 100, hms),
        "%s %s %2d %s %04d" % (DAYS[wd], mon, d.day, hms, d.year),
    ]


def reference(value):
    """Unix time of value by email.utils, or None."""
    try:
        tt = email.utils.parsedate_tz(value)
    except Exception:
        return None
    if tt is None or tt[9] not in (0, None):
        return None
    try:
        return email.utils.mktime_tz(tt[:9] + (0,))
    except (OverflowError, ValueError):
        return None


def main():
    tool = sys.argv[1]
    values = []
    for path in sys.stdin.read().split("\n"):
        if path:
            raw = open(path, "rb").read().split(b"\0")[0]
            if b"\n" not in raw and b"\t" not in raw:
                values.append(raw.decode("latin-1"))
    rng = random.Random(8785)
    lo = int(datetime(1601, 1, 1, tzinfo=timezone.utc).timestamp())
    hi = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp())
    for _ in range(20000):
        for f in forms(rng.randint(lo, hi)):
            values.append(f)
            i = rng.randrange(len(f))
            values.append(f[:i] + rng.choice("0 9:-,GZ") + f[i + 1:])  # one byte changed
    values = [v for v in values if v == v.strip(" \t")]
    lines = "".join("%d\t%s\n" % (0 if R850.match(v) or "-" in v else YEAR0, v) for v in values)
    out = subprocess.run([tool], input=lines.encode("latin-1"),
                         capture_output=True, check=True).stdout.decode().split("\n")
    dates = agree = 0
    failures = []
    for v, got in zip(values, out):
        ours = int(got)
        if v[:1].isdigit():
            continue  # delay-seconds, not a date
        ref = reference(v)
        m850 = R850.match(v)
        year = re.search(r"\b(\d{4})\b", v)
        if not m850 and year and int(year.group(1)) < 100:
            continue
        if ours >= 0:
            dates += 1
            if m850:
                # Read against 1970: dates before it read as 0, only later ones carry their time.
                d = datetime.fromtimestamp(ours // 1000, timezone.utc) if ours else None
                same = ref is not None and (d is None or (
                    d.year % 100 == int(m850.group(4)) and d.strftime("%d-%b %H:%M:%S") ==
                    "%s-%s %s:%s:%s" % m850.group(2, 3, 5, 6, 7)))
            else:
                same = ref is not None and ours // 1000 + YEAR0 == ref
            if same:
                agree += 1
            else:
                failures.append("%r: backoff.c %d ms, email.utils %r" % (v, ours, ref))
        elif ref is not None and not m850 and -62135596800 <= ref <= 253402300799:
            f = forms(ref)
            if v in (f[0], f[2]):
                failures.append("%r: refused by backoff.c, email.utils reads %d" % (v, ref))
    print("Retry-After dates vs email.utils: %d values, %d read as dates by backoff.c, %d agree, "
          "%d differences" % (len(values), dates, agree, len(failures)))
    for f in failures[:5]:
        print("  DIFF " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
