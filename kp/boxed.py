"""Entry point of a candidate's worker inside the box (`python -m kp.boxed FD LIMITS`): lower the limits before
anything else runs, take the judge's key for shared tensors, then serve the judge over the inherited socket."""
import json
import multiprocessing
import resource
import sys


def main() -> None:
    fd, limits, shared = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    from multiprocessing.connection import Connection
    conn = Connection(fd)
    # A CPU tensor crosses the wall as a file descriptor handed over a socket of the sender's multiprocessing
    # folder: the judge's, which the box shares, holds both sides' sockets; the key authenticates each hand-over.
    multiprocessing.current_process().authkey = conn.recv_bytes()
    multiprocessing.current_process()._config["tempdir"] = shared
    args = conn.recv()
    from kp.worker import worker_main
    worker_main(conn, *args)


if __name__ == "__main__":
    main()
