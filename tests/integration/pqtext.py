"""`psql -qtAX -F '\\t' -c SQL` without starting psql: the suite's `psql` fixture runs through
libpq (ctypes) on a connection of its own for each call, as psql would, and answers the text psql
prints — every result's rows, fields by tabs, rows by newlines — so that the fixture's parsing and
every caller see what they saw. Starting psql costs ~70 ms of a 2-core machine for each of the
suite's thousands of reads; a connection over the Unix socket a few.

Kept from psql: one simple Query for the whole string (one implicit transaction), the rows of
every statement in it (psql 15 shows them all), a statement's error ending the string and the
call raising CalledProcessError (exit 1; 2 when no connection is made) with what was printed
before it as its output, the error on stderr, and application_name `psql` unless the URL names
one."""
import ctypes
import ctypes.util
import subprocess
import sys

PGRES_TUPLES_OK = 2
PGRES_SINGLE_TUPLE = 9
CONNECTION_OK = 0
_ERRORS = {5, 6, 7}  # PGRES_BAD_RESPONSE, PGRES_NONFATAL_ERROR, PGRES_FATAL_ERROR
_COPY = {3, 4, 8}  # PGRES_COPY_OUT, PGRES_COPY_IN, PGRES_COPY_BOTH

_lib = None


def _libpq():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(ctypes.util.find_library("pq") or "libpq.so.5")
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        for name, res, args in (
                ("PQconnectdbParams", vp, [ctypes.POINTER(cp), ctypes.POINTER(cp), i]),
                ("PQstatus", i, [vp]), ("PQerrorMessage", cp, [vp]), ("PQfinish", None, [vp]),
                ("PQsendQuery", i, [vp, cp]), ("PQgetResult", vp, [vp]),
                ("PQresultStatus", i, [vp]), ("PQresultErrorMessage", cp, [vp]),
                ("PQntuples", i, [vp]), ("PQnfields", i, [vp]),
                ("PQgetvalue", cp, [vp, i, i]), ("PQclear", None, [vp])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        _lib = lib
    return _lib


def run(url, sql):
    """The text `psql URL -qtAX -F '\\t' -c SQL` prints on stdout."""
    lib = _libpq()
    cmd = ["psql", "-qtAX", "-F", "\t", "-c", sql]
    if "\0" in sql:
        raise ValueError("embedded null byte")  # as subprocess refuses it in an argument
    keys = (ctypes.c_char_p * 3)(b"dbname", b"fallback_application_name", None)
    vals = (ctypes.c_char_p * 3)(url.encode(), b"psql", None)
    conn = lib.PQconnectdbParams(keys, vals, 1)
    try:
        if not conn or lib.PQstatus(conn) != CONNECTION_OK:
            msg = lib.PQerrorMessage(conn) if conn else b"out of memory"
            sys.stderr.write("psql: error: " + (msg or b"").decode(errors="replace"))
            raise subprocess.CalledProcessError(2, cmd, output="")
        if not lib.PQsendQuery(conn, sql.encode()):
            sys.stderr.write((lib.PQerrorMessage(conn) or b"").decode(errors="replace"))
            raise subprocess.CalledProcessError(1, cmd, output="")
        out, error = [], None
        while True:
            res = lib.PQgetResult(conn)
            if not res:
                break
            try:
                st = lib.PQresultStatus(res)
                if st in (PGRES_TUPLES_OK, PGRES_SINGLE_TUPLE) and error is None:
                    nf = lib.PQnfields(res)
                    for r in range(lib.PQntuples(res)):
                        out.append("\t".join((lib.PQgetvalue(res, r, c) or b"").decode()
                                             for c in range(nf)) + "\n")
                elif st in _COPY:
                    # Not spoken here (a COPY result repeats until the copy ends): a test that
                    # needs one runs psql itself.
                    raise ValueError("pqtext: COPY is not supported; run psql")
                elif st in _ERRORS and error is None:
                    error = (lib.PQresultErrorMessage(res) or b"").decode(errors="replace")
            finally:
                lib.PQclear(res)
        if error is not None:
            sys.stderr.write(error)
            # psql's exit status: 2 when the connection was lost, 1 for an error of the SQL.
            code = 2 if lib.PQstatus(conn) != CONNECTION_OK else 1
            raise subprocess.CalledProcessError(code, cmd, output="".join(out))
        return "".join(out)
    finally:
        if conn:
            lib.PQfinish(conn)
