"""
Attacks on the sandboxes' resolver, run inside a sandbox by test/integration/security/network.test.ts:

  raw SRC SPORT NAME             one DNS query for NAME to the resolver (169.254.53.53:53) in a
                                 hand-built IPv4/UDP packet with source SRC:SPORT (a raw socket: a
                                 sandbox's root holds CAP_NET_RAW in its namespace)
  listen PORT UNTIL OUT          binds UDP PORT, writes OUT.ready, records the question of every
                                 datagram received until an answer about UNTIL (or 60 s), writes
                                 {"names": [...]} to OUT
  ask udp|tcp NAME               one plain query; prints {"outcome": "answer:<rcode>" | "timeout" | errno}
  flood TAG UDP CONNS PER DIR    UDP queries for UDP distinct names under TAG, CONNS TCP connections
                                 each pipelining PER queries, then DIR/flooding; goes on sending UDP
                                 queries until DIR/stop exists (at most 60 s), writes DIR/done
Prints one JSON line; exits 0 unless the attack itself could not be tried.
"""
import errno
import json
import os
import random
import socket
import struct
import sys
import time

RESOLVER = ("169.254.53.53", 53)


def query(name, qid=None):
    qid = random.randint(0, 65535) if qid is None else qid
    labels = b"".join(bytes([len(l)]) + l.encode() for l in name.split("."))
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


def question_of(msg):
    i, labels = 12, []
    while i < len(msg) and msg[i]:
        labels.append(msg[i + 1 : i + 1 + msg[i]].decode("ascii", "replace"))
        i += 1 + msg[i]
    return ".".join(labels)


def checksum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def raw(src, sport, name):
    payload = query(name)
    ulen = 8 + len(payload)
    pseudo = socket.inet_aton(src) + socket.inet_aton(RESOLVER[0]) + struct.pack("!BBH", 0, 17, ulen)
    c = checksum(pseudo + struct.pack("!HHHH", sport, RESOLVER[1], ulen, 0) + payload) or 0xFFFF
    udp = struct.pack("!HHHH", sport, RESOLVER[1], ulen, c) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, random.randint(0, 65535), 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(RESOLVER[0]))
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    try:
        s.sendto(ip + udp, (RESOLVER[0], 0))
    finally:
        s.close()
    return {"sent": True}


def listen(port, until, out):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    open(out + ".ready", "w").close()
    names, deadline = [], time.time() + 60
    while time.time() < deadline:
        s.settimeout(max(0.1, deadline - time.time()))
        try:
            msg = s.recv(65535)
        except socket.timeout:
            break
        names.append(question_of(msg))
        if names[-1] == until:
            break
    with open(out + ".tmp", "w") as f:
        json.dump({"names": names}, f)
    os.rename(out + ".tmp", out)
    return {"names": names}


def ask(proto, name):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.connect(RESOLVER)
        q = query(name)
        if proto == "tcp":
            s.sendall(struct.pack("!H", len(q)) + q)
            msg = s.recv(65535)[2:]
        else:
            s.send(q)
            msg = s.recv(65535)
        return {"outcome": "answer:%d" % (msg[3] & 0xF) if len(msg) >= 12 else "closed"}
    except socket.timeout:
        return {"outcome": "timeout"}
    except OSError as e:
        return {"outcome": errno.errorcode.get(e.errno, str(e.errno))}
    finally:
        s.close()


def flood(tag, n_udp, conns, per, folder):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setblocking(False)
    sent = {"udp": 0, "tcp": 0, "connections": 0}
    counter = [0]

    def burst(n):
        for _ in range(n):
            counter[0] += 1
            try:
                u.sendto(query("u%d.%s.hole.sap-net.test" % (counter[0], tag)), RESOLVER)
                sent["udp"] += 1
            except OSError:
                time.sleep(0.001)

    burst(n_udp)
    held = []
    for c in range(conns):
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.settimeout(2)
        try:
            t.connect(RESOLVER)
            sent["connections"] += 1
            data = b"".join(struct.pack("!H", len(q)) + q for q in (query("t%d-%d.%s.hole.sap-net.test" % (c, i, tag)) for i in range(per)))
            t.sendall(data)
            sent["tcp"] += per
        except OSError:
            pass
        held.append(t)
    open(os.path.join(folder, "flooding"), "w").close()
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(folder, "stop")) and time.time() < deadline:
        burst(200)
        time.sleep(0.01)
    for t in held:
        t.close()
    with open(os.path.join(folder, "done"), "w") as f:
        json.dump(sent, f)
    return sent


cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "raw":
    result = raw(args[0], int(args[1]), args[2])
elif cmd == "listen":
    result = listen(int(args[0]), args[1], args[2])
elif cmd == "ask":
    result = ask(args[0], args[1])
elif cmd == "flood":
    result = flood(args[0], int(args[1]), int(args[2]), int(args[3]), args[4])
else:
    sys.exit("unknown command " + cmd)
print(json.dumps(result))
