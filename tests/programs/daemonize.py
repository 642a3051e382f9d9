"""Double-fork, setsid, and sleep: the classic daemon that escapes a process-group kill.

argv[1]: a file to write the daemon's pid into. The parent exits at once unless argv[2] == "stay".
"""

import os
import sys
import time

pid_file = sys.argv[1]
stay = len(sys.argv) > 2 and sys.argv[2] == "stay"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        time.sleep(600)
    os._exit(0)
# Exit only once the daemon has announced itself, so a test knows whom to look for.
while not os.path.exists(pid_file):
    time.sleep(0.005)
if stay:
    print("parent staying", flush=True)
    time.sleep(600)
