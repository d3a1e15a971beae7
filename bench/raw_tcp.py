#!/usr/bin/env python3
"""The ceiling a link leaves to any library: plain tcp streams between two hosts,
both directions at once, as an allreduce between two hosts moves its bytes.

Run the same command on both hosts (bench/compare_cluster.sh's namespace cluster:
scripts/netns-cluster.sh exec H ...); each listens on PORT, connects STREAMS streams
to the peer, sends BYTES on each and reads the peer's. Prints, on the host given
--report, the bytes per second each direction carried from the first byte to the
last, in GB/s and as a share of --rate (tc's units).

  raw_tcp.py --local 10.77.0.1 --peer 10.77.0.2 [--port 29700] [--streams 2]
             [--bytes 256M] [--rate 1gbit] [--timeout 120] [--report]
"""
import argparse
import re
import socket
import sys
import threading
import time

CHUNK = 4 << 20


def size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size '{text}' (e.g. 256M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def rate_bytes(text):
    m = re.fullmatch(r"(\d+)(k|m|g)?bit", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad rate '{text}' (e.g. 1gbit)")
    return int(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--local", required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--port", type=int, default=29700)
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--bytes", type=size, default=size("256M"))
    p.add_argument("--rate", type=rate_bytes, default=rate_bytes("1gbit"))
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--report", action="store_true")
    a = p.parse_args()
    if a.streams < 1 or a.bytes < 1:
        p.error("--streams and --bytes must be positive")

    listener = socket.create_server((a.local, a.port), backlog=a.streams)
    listener.settimeout(a.timeout)
    deadline = time.monotonic() + a.timeout
    outgoing = []
    while len(outgoing) < a.streams:  # the peer may not listen yet
        try:
            outgoing.append(socket.create_connection((a.peer, a.port), timeout=a.timeout))
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"raw_tcp: cannot connect to {a.peer}:{a.port}")
            time.sleep(0.05)
    incoming = [listener.accept()[0] for _ in range(a.streams)]
    marks, errors = {"sent": [], "received": []}, []

    def send(s):
        try:
            buf = memoryview(bytearray(CHUNK))
            left = a.bytes
            while left > 0:
                n = s.send(buf[: min(CHUNK, left)])
                left -= n
            marks["sent"].append(time.monotonic())
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            errors.append(f"send: {e}")

    def receive(s):
        try:
            buf = bytearray(CHUNK)
            got, first = 0, None
            while got < a.bytes:
                n = s.recv_into(buf)
                if n == 0:
                    raise OSError(f"peer closed after {got} of {a.bytes} bytes")
                first = first or time.monotonic()
                got += n
            marks["received"].append((first, time.monotonic()))
        except OSError as e:
            errors.append(f"receive: {e}")

    for s in outgoing + incoming:
        s.settimeout(a.timeout)
    threads = [threading.Thread(target=send, args=(s,)) for s in outgoing]
    threads += [threading.Thread(target=receive, args=(s,)) for s in incoming]
    for t in threads:
        t.start()
    for t in threads:
        t.join(a.timeout)
    if errors or any(t.is_alive() for t in threads):
        sys.exit("raw_tcp: " + ("; ".join(errors) or "timed out"))
    first = min(f for f, _ in marks["received"])
    last = max(l for _, l in marks["received"])
    gbs = a.streams * a.bytes / (last - first) / 1e9
    if a.report:
        print(f"{a.streams} stream(s) x {a.bytes} bytes each way: {gbs:.4f} GB/s received, "
              f"{gbs * 1e9 / a.rate:.3f} of the link")


if __name__ == "__main__":
    main()
