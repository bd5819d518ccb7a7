"""`python -m collab.dbcheck URL`: exit 0 when the PostgreSQL at URL answers (Makefile, CI)."""

import sys

import psycopg

if __name__ == "__main__":
    try:
        with psycopg.connect(sys.argv[1], connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        print(f"PostgreSQL not reachable: {exc}", file=sys.stderr)
        sys.exit(1)
