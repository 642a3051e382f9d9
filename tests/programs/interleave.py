"""Alternates lines on stdout and stderr, flushing each, so arrival order is known."""

import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
for i in range(n):
    stream = sys.stdout if i % 2 == 0 else sys.stderr
    stream.write(f"line {i} {'out' if i % 2 == 0 else 'err'}\n")
    stream.flush()
    time.sleep(0.02)  # two pipes: a reader held up longer than this (a loaded machine) may see both at once
