"""procpilot on a Ray cluster (``[cluster] backend = "ray"``): one supervisor per node, one daemon.

    daemon (procpilot serve)                      each Ray node
    faces ─► Supervisor ─► RayLauncher ─spawn/kill/write─► NodeAgent actor ─► Supervisor (the engine)
                 ▲  RemoteSession (a Session)                              │ session files
                 └────── one output stream per session ◄───────────────────┘

Modules: ``launcher`` (the daemon side: the Launcher its engine Supervisor is given),
``remote`` (a session on another node), ``node`` (the actor's body), ``placement`` (which
node), ``replies`` (errors across the wire) and ``ray_backend``, the one module that imports
Ray (so this package itself imports nothing: its pure parts, placement and replies, load
without Ray). Only ``serve.make_supervisor`` imports ``procpilot.cluster.launcher``, and only
for the ray backend.
"""
