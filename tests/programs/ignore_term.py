"""Ignores SIGTERM, says so, then sleeps: only SIGKILL ends it."""

import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
sys.stdout.flush()
time.sleep(600)
