#!/usr/bin/python3
"""tests/net/id_rewriter.py: a hostile-but-valid RoCEv2 "peer" between two softrnic hosts.

Runs in a router namespace whose kernel does NOT forward (ip_forward=0); it relays every IPv4
packet between two interfaces itself (AF_PACKET in, a raw IP_HDRINCL socket out). RoCEv2
datagrams (UDP 4791) leave rewritten as a hardware peer may send them: a random non-zero IP
ID with the ICRC recomputed over it (docs/wire.md sections 2-3), UDP checksum 0, and every
--ce-every'th packet ECN-CE marked (TOS is masked out of the ICRC). Every --cnp-every'th RoCE
packet it also sends a CNP (BTH opcode 0x81, 16 reserved bytes, a valid ICRC, random ID) to
the same destination QP. Other packets (the tools' TCP exchange, ARP is the kernel's) pass
unchanged. Prints counts on SIGTERM.
  id_rewriter.py IF1 IF2 [--ce-every N] [--cnp-every N] [--seed S]
"""
import argparse
import random
import select
import signal
import socket
import struct
import sys
import zlib

ETH_P_IP = 0x0800
PACKET_OUTGOING = 4
ROCE_PORT = 4791


def ip_checksum(hdr):
    s = 0
    for i in range(0, len(hdr), 2):
        s += (hdr[i] << 8) | hdr[i + 1]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def icrc(ip_hdr, udp_hdr, roce_wo_icrc):
    """RoCEv2 ICRC (docs/wire.md section 2): CRC-32 over 8 x 0xFF, the IPv4 header with TOS,
    TTL and checksum set to ones, UDP with checksum ones, BTH with byte 4 ones, the rest."""
    ip = bytearray(ip_hdr)
    ip[1] = 0xFF
    ip[8] = 0xFF
    ip[10:12] = b"\xff\xff"
    udp = bytearray(udp_hdr)
    udp[6:8] = b"\xff\xff"
    roce = bytearray(roce_wo_icrc)
    roce[4] = 0xFF
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(roce)))


def build(ip_hdr, udp_hdr, roce_wo_icrc, ip_id, tos):
    ip = bytearray(ip_hdr)
    ip[1] = tos
    struct.pack_into("!H", ip, 4, ip_id)
    ip[10:12] = b"\x00\x00"
    udp = bytearray(udp_hdr)
    udp[6:8] = b"\x00\x00"  # UDP checksum 0: "none" for IPv4, as some hardware sends
    trailer = icrc(ip, udp, roce_wo_icrc)
    struct.pack_into("!H", ip, 10, ip_checksum(ip))
    return bytes(ip) + bytes(udp) + bytes(roce_wo_icrc) + trailer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ifs", nargs=2)
    ap.add_argument("--ce-every", type=int, default=5)
    ap.add_argument("--cnp-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rx = []
    for name in a.ifs:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
        s.bind((name, 0))
        rx.append(s)
    tx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    tx.setsockopt(socket.SOL_IP, socket.IP_HDRINCL, 1)
    n = {"relayed": 0, "roce": 0, "ce": 0, "cnp": 0}

    def stop(*_):
        print("id_rewriter: relayed %(relayed)d, rewrote %(roce)d RoCE packets, "
              "%(ce)d CE-marked, %(cnp)d CNPs sent" % n, flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("id_rewriter: relaying between %s and %s" % tuple(a.ifs), flush=True)
    while True:
        ready, _, _ = select.select(rx, [], [])
        for s in ready:
            frame, addr = s.recvfrom(65535)
            if addr[2] == PACKET_OUTGOING:
                continue
            pkt = frame[14:] if addr[3] == 1 else frame  # ARPHRD_ETHER: strip Ethernet
            if len(pkt) < 20 or pkt[0] >> 4 != 4:
                continue
            ihl = (pkt[0] & 0xF) * 4
            total = struct.unpack_from("!H", pkt, 2)[0]
            pkt = pkt[:total]
            dst = socket.inet_ntoa(pkt[16:20])
            if dst.endswith(".254"):
                continue  # for the router itself: its kernel answers
            out = pkt
            if pkt[9] == 17 and len(pkt) >= ihl + 8 + 16:
                dport = struct.unpack_from("!H", pkt, ihl + 2)[0]
                if dport == ROCE_PORT and ihl == 20:
                    ip_hdr, udp_hdr = pkt[:20], pkt[20:28]
                    roce = pkt[28:-4]
                    n["roce"] += 1
                    tos = pkt[1]
                    if a.ce_every > 0 and n["roce"] % a.ce_every == 0:
                        tos = (tos & 0xFC) | 3
                        n["ce"] += 1
                    out = build(ip_hdr, udp_hdr, roce, rng.randint(1, 0xFFFF), tos)
                    if a.cnp_every > 0 and n["roce"] % a.cnp_every == 0:
                        # CNP: BTH (opcode 0x81, P_Key 0xFFFF, the packet's dest QP, PSN 0),
                        # 16 reserved bytes, ICRC (IBA A17.9.1 / docs/wire.md).
                        bth = bytearray(12)
                        bth[0] = 0x81
                        bth[2:4] = b"\xff\xff"
                        bth[5:8] = roce[5:8]
                        body = bytes(bth) + bytes(16)
                        udp = bytearray(udp_hdr)
                        struct.pack_into("!H", udp, 4, 8 + len(body) + 4)
                        ip = bytearray(ip_hdr)
                        struct.pack_into("!H", ip, 2, 20 + 8 + len(body) + 4)
                        cnp = build(ip, udp, body, rng.randint(1, 0xFFFF), 0)
                        tx.sendto(cnp, (dst, 0))
                        n["cnp"] += 1
            try:
                tx.sendto(out, (dst, 0))
                n["relayed"] += 1
            except OSError as e:
                print("id_rewriter: send to %s: %s" % (dst, e), flush=True)


if __name__ == "__main__":
    main()
