"""engine/processes.holds_listener: which process listens on a port (a local server's start relies on it
to tell its own port from one another process took first)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def test_the_listener_is_found_in_its_own_process_only() -> None:
    from airflow_provider_kappa.engine.processes import holds_listener

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert holds_listener(os.getpid(), port) is True
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert holds_listener(other.pid, port) is False
        finally:
            other.kill()
            other.wait()
        assert holds_listener(other.pid, port) is False  # gone
    assert holds_listener(os.getpid(), port) is False  # closed: nobody listens
