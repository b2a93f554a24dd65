#!/usr/bin/python3
"""bench/chaos/proxy.py: the network of a partitionable worker (the chaos driver's
partition_worker fault), after tests/test_e2e.c's proxy.

usage: proxy.py NETNS PORT...
Listens on 127.0.0.1:PORT inside network namespace NETNS (the worker's, where the broker and the
object store are not) and relays every connection byte for byte to 127.0.0.1:PORT of the
namespace it was started in (so SASL passes through untouched). SIGUSR1 cuts: nothing is read,
written or accepted any more, as if packets went nowhere; SIGUSR2 heals. Exits on SIGTERM."""
import ctypes
import os
import selectors
import signal
import socket
import sys
import time

CLONE_NEWNET = 0x40000000
cut = False


def setns(fd):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def main():
    global cut
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ns, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    setns(there)
    listeners = []
    for p in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", p))
        s.listen(128)
        s.setblocking(False)
        listeners.append((s, p))
    setns(home)  # upstream connections from the namespace we came from

    def on_cut(*_):
        global cut
        cut = True

    def on_heal(*_):
        global cut
        cut = False
    signal.signal(signal.SIGUSR1, on_cut)
    signal.signal(signal.SIGUSR2, on_heal)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    for s, p in listeners:
        sel.register(s, selectors.EVENT_READ, ("listen", p))
    print("proxy: ready", flush=True)
    while True:
        if cut:
            time.sleep(0.1)
            continue
        for key, _ in sel.select(0.1):
            if cut:
                break
            kind, arg = key.data
            if kind == "listen":
                try:
                    c, _ = key.fileobj.accept()
                except BlockingIOError:
                    continue
                u = socket.socket()
                try:
                    u.connect(("127.0.0.1", arg))
                except OSError:
                    c.close()
                    u.close()
                    continue
                sel.register(c, selectors.EVENT_READ, ("pipe", u))
                sel.register(u, selectors.EVENT_READ, ("pipe", c))
                continue
            src, dst = key.fileobj, arg
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if data:
                try:
                    dst.sendall(data)
                    continue
                except OSError:
                    pass
            for s in (src, dst):
                try:
                    sel.unregister(s)
                except (KeyError, ValueError):
                    pass
                s.close()


if __name__ == "__main__":
    main()
