/**
 * rtnetlink messages as bytes: the encoders for the few requests Atoll's hot path sends (veth pair with its peer
 * created in another namespace, link attributes, bridge-port hairpin, IPv4 address, default route, link deletion,
 * link query), the dumps its resync reads (links, IPv4 addresses, routes and neighbours, bridge fdb entries), the
 * nf_tables ruleset generation, and the decoders for what the kernel answers (acks, errors with their extended-ack
 * text, links, addresses, routes, neighbours, the generation).
 * Pure: no I/O, no `node:` imports; the socket lives in src/adapters/kernel/netlink.ts.
 *
 * Layouts follow the kernel's uapi headers (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/veth.h,
 * linux/if_addr.h). Integers are in host byte order except addresses, which are in network order. Every message
 * and attribute is padded to 4 bytes. The attribute orders match what iproute2 sends for the same command, so the
 * golden tests can use bytes captured from `strace ip ...`.
 */
import { atollError } from '../errors.ts';

/** Netlink integers are in the host's byte order. */
const LE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export const NLMSG_ERROR = 2;
export const NLMSG_DONE = 3;

export const RTM_NEWLINK = 16;
export const RTM_DELLINK = 17;
export const RTM_GETLINK = 18;
export const RTM_SETLINK = 19;
export const RTM_NEWADDR = 20;
export const RTM_GETADDR = 22;
export const RTM_NEWROUTE = 24;
export const RTM_GETROUTE = 26;
export const RTM_GETNEIGH = 30;

export const NLM_F_REQUEST = 0x1;
export const NLM_F_ACK = 0x4;
/** In a dump's answers: the objects changed while the kernel listed them; the list may be inconsistent. */
export const NLM_F_DUMP_INTR = 0x10;
/** NLM_F_ROOT | NLM_F_MATCH: list every object of the kind. */
export const NLM_F_DUMP = 0x300;
export const NLM_F_EXCL = 0x200;
export const NLM_F_CREATE = 0x400;
/** In an NLMSG_ERROR answer: the echoed request was cut to its header (NETLINK_CAP_ACK). */
export const NLM_F_CAPPED = 0x100;
/** In an NLMSG_ERROR answer: extended-ack attributes follow (NETLINK_EXT_ACK). */
export const NLM_F_ACK_TLVS = 0x200;

export const AF_UNSPEC = 0;
export const AF_INET = 2;
export const AF_BRIDGE = 7;
export const IFF_UP = 0x1;

export const IFLA_ADDRESS = 1;
export const IFLA_IFNAME = 3;
export const IFLA_MTU = 4;
export const IFLA_LINK = 5;
export const IFLA_MASTER = 10;
export const IFLA_LINKINFO = 18;
export const IFLA_EXT_MASK = 29;
export const IFLA_NET_NS_FD = 28;
export const IFLA_INFO_KIND = 1;
export const IFLA_INFO_DATA = 2;
export const IFLA_INFO_SLAVE_DATA = 5;
export const VETH_INFO_PEER = 1;
export const IFLA_VXLAN_ID = 1;
export const IFLA_VXLAN_LOCAL = 4;
export const IFLA_VXLAN_LEARNING = 7;
export const IFLA_VXLAN_PORT = 15;
export const IFLA_BRPORT_MODE = 4;
/** IFLA_EXT_MASK bits: leave statistics out of link answers (smaller, cheaper). */
export const RTEXT_FILTER_VF = 1 << 0;
export const RTEXT_FILTER_SKIP_STATS = 1 << 3;

export const IFA_ADDRESS = 1;
export const IFA_LOCAL = 2;

export const RTA_DST = 1;
export const RTA_OIF = 4;
export const RTA_GATEWAY = 5;
export const RTA_TABLE = 15;
export const RT_TABLE_MAIN = 254;
/** rtm_flags: the gateway is taken as on the link (`onlink`). */
export const RTNH_F_ONLINK = 4;
/** The protocol `ip route add` stamps on routes it adds. */
export const RTPROT_BOOT = 3;
export const RT_SCOPE_UNIVERSE = 0;
export const RTN_UNICAST = 1;

export const NDA_DST = 1;
export const NDA_LLADDR = 2;
export const NUD_PERMANENT = 0x80;

/** nfnetlink: the nf_tables subsystem's NFT_MSG_GETGEN, answered by NFT_MSG_NEWGEN with NFTA_GEN_ID. */
export const NETLINK_NETFILTER = 12;
const NFNL_SUBSYS_NFTABLES = 10;
export const NFT_MSG_NEWGEN = (NFNL_SUBSYS_NFTABLES << 8) | 15;
const NFT_MSG_GETGEN = (NFNL_SUBSYS_NFTABLES << 8) | 16;
const NFTA_GEN_ID = 1;

/** Extended-ack attribute holding the kernel's error text. */
export const NLMSGERR_ATTR_MSG = 1;

/** Set in an attribute's type when its payload is itself attributes. */
export const NLA_F_NESTED = 0x8000;
const NLA_TYPE_MASK = 0x3fff;

const NLMSG_HDRLEN = 16;
const IFINFOMSG_LEN = 16;
const IFADDRMSG_LEN = 8;
const RTMSG_LEN = 12;
const NDMSG_LEN = 12;
const NFGENMSG_LEN = 4;

const align4 = (n: number) => (n + 3) & ~3;

// ---------------------------------------------------------------------------------------------------------------
// Attributes

/** One rtattr: raw payload bytes, or nested attributes (optionally flagged NLA_F_NESTED). */
export type Attr =
  | { readonly type: number; readonly data: Uint8Array }
  | { readonly type: number; readonly nested: readonly Attr[]; readonly flagNested?: boolean; readonly header?: Uint8Array };

function u32Bytes(n: number): Uint8Array {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n >>> 0, LE);
  return b;
}

export const attrU8 = (type: number, n: number): Attr => ({ type, data: Uint8Array.of(n & 255) });
export const attrU32 = (type: number, n: number): Attr => ({ type, data: u32Bytes(n) });
/** A NUL-terminated string, as the kernel wants interface names and kinds. */
export const attrString = (type: number, s: string): Attr => ({ type, data: asciiz(s) });
/** Bytes without a terminator (IFLA_INFO_KIND is sent this way by iproute2; the kernel accepts both). */
export const attrBytes = (type: number, data: Uint8Array): Attr => ({ type, data });
export const attrIpv4 = (type: number, ip: number): Attr => ({ type, data: Uint8Array.of(ip >>> 24, (ip >>> 16) & 255, (ip >>> 8) & 255, ip & 255) });
export const attrMac = (type: number, mac: string): Attr => ({ type, data: parseMac(mac) });
export const nest = (type: number, nested: readonly Attr[], flagNested = false): Attr => ({ type, nested, flagNested });

function asciiz(s: string): Uint8Array {
  const b = new Uint8Array(s.length + 1);
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0 || c > 127) {
      throw atollError('KERNEL_OP_FAILED', `netlink string "${s}" must be printable ASCII (an interface name or kind)`,
        'use an ASCII interface name: CNI_IFNAME from the runtime, or the device names in the agent configuration');
    }
    b[i] = c;
  }
  return b;
}

const ascii = (s: string): Uint8Array => asciiz(s).subarray(0, s.length);

/** "0a:58:0a:f4:01:07" to 6 bytes. @throws Error when it is not a MAC address. */
export function parseMac(mac: string): Uint8Array {
  const parts = mac.split(':');
  // cannot happen: every MAC sent is computed by src/core/plan/pod-plan.ts (hostVethMac, macForIp), never taken from input
  if (parts.length !== 6 || parts.some((p) => !/^[0-9a-fA-F]{2}$/.test(p))) throw new Error(`"${mac}" is not a MAC address`);
  return Uint8Array.from(parts.map((p) => parseInt(p, 16)));
}

export function formatMac(b: Uint8Array): string {
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

function attrSize(a: Attr): number {
  if ('data' in a) return 4 + a.data.length;
  return 4 + (a.header?.length ?? 0) + a.nested.reduce((n, x) => n + align4(attrSize(x)), 0);
}

function writeAttrs(out: Uint8Array, view: DataView, at: number, attrs: readonly Attr[]): number {
  for (const a of attrs) {
    const len = attrSize(a);
    view.setUint16(at, len, LE);
    view.setUint16(at + 2, 'data' in a ? a.type : a.type | (a.flagNested ? NLA_F_NESTED : 0), LE);
    if ('data' in a) {
      out.set(a.data, at + 4);
    } else {
      let p = at + 4;
      if (a.header) {
        out.set(a.header, p);
        p += a.header.length;
      }
      writeAttrs(out, view, p, a.nested);
    }
    at += align4(len);
  }
  return at;
}

// ---------------------------------------------------------------------------------------------------------------
// Messages

/** A request without its sequence number: the socket adapter numbers it when it sends. */
export interface NlRequest {
  readonly type: number;
  readonly flags: number;
  /** The fixed family header (ifinfomsg, ifaddrmsg, rtmsg). */
  readonly header: Uint8Array;
  readonly attrs: readonly Attr[];
  /** What the request does to which object, for errors: "creating veth atl… (peer eth0 in /run/netns/x)". */
  readonly what: string;
}

/** Encodes `req` as one netlink message with sequence number `seq` (port ID 0: the kernel fills it in). */
export function encodeRequest(req: NlRequest, seq: number): Uint8Array {
  const len = NLMSG_HDRLEN + req.header.length + req.attrs.reduce((n, a) => n + align4(attrSize(a)), 0);
  const out = new Uint8Array(align4(len));
  const view = new DataView(out.buffer);
  view.setUint32(0, len, LE);
  view.setUint16(4, req.type, LE);
  view.setUint16(6, req.flags, LE);
  view.setUint32(8, seq >>> 0, LE);
  view.setUint32(12, 0, LE);
  out.set(req.header, NLMSG_HDRLEN);
  writeAttrs(out, view, NLMSG_HDRLEN + req.header.length, req.attrs);
  return out;
}

/** Several requests back to back, numbered from `firstSeq`: the kernel handles them in order in one `send`. */
export function encodeBatch(reqs: readonly NlRequest[], firstSeq: number): Uint8Array {
  const parts = reqs.map((r, i) => encodeRequest(r, firstSeq + i));
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function ifinfomsg(p: { family?: number; index?: number; flags?: number; change?: number } = {}): Uint8Array {
  const b = new Uint8Array(IFINFOMSG_LEN);
  const v = new DataView(b.buffer);
  b[0] = p.family ?? AF_UNSPEC;
  v.setInt32(4, p.index ?? 0, LE);
  v.setUint32(8, p.flags ?? 0, LE);
  v.setUint32(12, p.change ?? 0, LE);
  return b;
}

/**
 * A link by index, or by name (sent as IFLA_IFNAME: RTM_NEWLINK, RTM_DELLINK and RTM_GETLINK look links up by it).
 * With an index, `label` only names the link in errors: an IFLA_IFNAME beside an index would rename the link.
 */
export type LinkRef = { readonly index: number; readonly label?: string } | { readonly name: string };

const refName = (r: LinkRef) => ('name' in r ? r.name : (r.label ?? `#${r.index}`));
const refHeader = (r: LinkRef, extra: { flags?: number; change?: number } = {}) => ifinfomsg({ index: 'index' in r ? r.index : 0, ...extra });
const refAttrs = (r: LinkRef): Attr[] => ('name' in r ? [attrString(IFLA_IFNAME, r.name)] : []);

export interface VethEnd {
  readonly name: string;
  readonly mac: string;
  readonly mtu: number;
}

export interface NewVeth extends VethEnd {
  /** ifindex of a bridge to enslave the host end to, in the same request (the kernel does it after creating). */
  readonly masterIndex?: number;
  readonly peer: VethEnd & {
    /** An open file descriptor of the network namespace the peer is created in (IFLA_NET_NS_FD). */
    readonly netnsFd: number;
    /** Shown in errors only. */
    readonly netnsPath: string;
  };
}

/**
 * RTM_NEWLINK creating a veth pair whose peer is born inside another namespace (moving a link costs about 13 ms).
 * Fails with EEXIST when either name is taken in its namespace.
 */
export function newVeth(v: NewVeth): NlRequest {
  const peer: Attr = {
    type: VETH_INFO_PEER,
    header: ifinfomsg(),
    nested: [attrU32(IFLA_MTU, v.peer.mtu), attrMac(IFLA_ADDRESS, v.peer.mac), attrU32(IFLA_NET_NS_FD, v.peer.netnsFd), attrString(IFLA_IFNAME, v.peer.name)],
  };
  return {
    type: RTM_NEWLINK,
    flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
    header: ifinfomsg(),
    attrs: [
      attrU32(IFLA_MTU, v.mtu),
      attrMac(IFLA_ADDRESS, v.mac),
      ...(v.masterIndex === undefined ? [] : [attrU32(IFLA_MASTER, v.masterIndex)]),
      attrString(IFLA_IFNAME, v.name),
      nest(IFLA_LINKINFO, [attrBytes(IFLA_INFO_KIND, ascii('veth')), nest(IFLA_INFO_DATA, [peer])]),
    ],
    what: `creating veth ${v.name} (peer ${v.peer.name} in ${v.peer.netnsPath})`,
  };
}

/** RTM_NEWLINK on an existing link: IFLA_MASTER (0 detaches it). */
export function setMaster(link: LinkRef, masterIndex: number): NlRequest {
  return {
    type: RTM_NEWLINK,
    flags: NLM_F_REQUEST | NLM_F_ACK,
    header: refHeader(link),
    attrs: [...refAttrs(link), attrU32(IFLA_MASTER, masterIndex)],
    what: masterIndex === 0 ? `detaching link ${refName(link)} from its master` : `attaching link ${refName(link)} to master #${masterIndex}`,
  };
}

/** RTM_NEWLINK setting or clearing IFF_UP. */
export function setUp(link: LinkRef, up = true): NlRequest {
  return {
    type: RTM_NEWLINK,
    flags: NLM_F_REQUEST | NLM_F_ACK,
    header: refHeader(link, { flags: up ? IFF_UP : 0, change: IFF_UP }),
    attrs: refAttrs(link),
    what: `setting link ${refName(link)} ${up ? 'up' : 'down'}`,
  };
}

/**
 * Hairpin mode on a bridge port (IFLA_BRPORT_MODE=1), as `ip link set dev X type bridge_slave hairpin on` sends it:
 * RTM_NEWLINK with IFLA_LINKINFO / IFLA_INFO_SLAVE_DATA, handled by the link's current master. Unlike the AF_BRIDGE
 * RTM_SETLINK form it accepts a name, so it can follow the veth's creation in the same batch. The link must already
 * be a bridge port (else EOPNOTSUPP).
 */
export function setBridgePortHairpin(link: LinkRef, on = true): NlRequest {
  return {
    type: RTM_NEWLINK,
    flags: NLM_F_REQUEST | NLM_F_ACK,
    header: refHeader(link),
    attrs: [...refAttrs(link), nest(IFLA_LINKINFO, [attrBytes(IFLA_INFO_KIND, ascii('bridge_slave')), nest(IFLA_INFO_SLAVE_DATA, [attrU8(IFLA_BRPORT_MODE, on ? 1 : 0)])])],
    what: `setting hairpin ${on ? 'on' : 'off'} on bridge port ${refName(link)}`,
  };
}

/** RTM_DELLINK. Deleting either end of a veth deletes both. ENODEV when there is no such link. */
export function delLink(link: LinkRef): NlRequest {
  return { type: RTM_DELLINK, flags: NLM_F_REQUEST | NLM_F_ACK, header: refHeader(link), attrs: refAttrs(link), what: `deleting link ${refName(link)}` };
}

/** RTM_GETLINK for one link, without statistics; answered by one RTM_NEWLINK (see {@link decodeLink}) or ENODEV. */
export function getLink(link: LinkRef): NlRequest {
  return {
    type: RTM_GETLINK,
    flags: NLM_F_REQUEST,
    header: refHeader(link),
    attrs: [attrU32(IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS), ...refAttrs(link)],
    what: `reading link ${refName(link)}`,
  };
}

/** Every link, without statistics: RTM_NEWLINK answers (see {@link decodeLink}) until NLMSG_DONE. */
export function dumpLinks(): NlRequest {
  return { type: RTM_GETLINK, flags: NLM_F_REQUEST | NLM_F_DUMP, header: ifinfomsg(), attrs: [attrU32(IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)], what: 'listing links' };
}

/** Every IPv4 address: RTM_NEWADDR answers (see {@link decodeAddr}). */
export function dumpAddrs4(): NlRequest {
  const header = new Uint8Array(IFADDRMSG_LEN);
  header[0] = AF_INET;
  return { type: RTM_GETADDR, flags: NLM_F_REQUEST | NLM_F_DUMP, header, attrs: [], what: 'listing IPv4 addresses' };
}

/** Every IPv4 route of every table: RTM_NEWROUTE answers (see {@link decodeRoute}). */
export function dumpRoutes4(): NlRequest {
  const header = new Uint8Array(RTMSG_LEN);
  header[0] = AF_INET;
  return { type: RTM_GETROUTE, flags: NLM_F_REQUEST | NLM_F_DUMP, header, attrs: [], what: 'listing IPv4 routes' };
}

/**
 * Every neighbour of a family: AF_INET for the ARP table, AF_BRIDGE for the forwarding databases of bridges and
 * VXLAN devices. RTM_NEWNEIGH answers (RTM_NEWNEIGH; see {@link decodeNeigh}).
 */
export function dumpNeighbours(family: typeof AF_INET | typeof AF_BRIDGE): NlRequest {
  const header = new Uint8Array(NDMSG_LEN);
  header[0] = family;
  return { type: RTM_GETNEIGH, flags: NLM_F_REQUEST | NLM_F_DUMP, header, attrs: [], what: family === AF_BRIDGE ? 'listing forwarding database entries' : 'listing IPv4 neighbours' };
}

/** NFT_MSG_GETGEN on a NETLINK_NETFILTER socket: the namespace's ruleset generation (see {@link decodeGeneration}). */
export function getGeneration(): NlRequest {
  return { type: NFT_MSG_GETGEN, flags: NLM_F_REQUEST, header: new Uint8Array(NFGENMSG_LEN), attrs: [], what: 'reading the nftables ruleset generation' };
}

/** RTM_NEWADDR of an IPv4 address (local = address, no broadcast), as `ip addr add A/N dev D`. EEXIST when present. */
export function newAddr4(p: { index: number; ip: number; prefixLen: number; ifName: string }): NlRequest {
  const header = new Uint8Array(IFADDRMSG_LEN);
  header.set([AF_INET, p.prefixLen, 0, RT_SCOPE_UNIVERSE]);
  new DataView(header.buffer).setUint32(4, p.index, LE);
  return {
    type: RTM_NEWADDR,
    flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
    header,
    attrs: [attrIpv4(IFA_LOCAL, p.ip), attrIpv4(IFA_ADDRESS, p.ip)],
    what: `adding address ${ipv4Text(p.ip)}/${p.prefixLen} to ${p.ifName}`,
  };
}

/** RTM_NEWROUTE of the IPv4 default route via `gateway` on link `oif`, main table, as `ip route add default via G dev D`. */
export function newDefaultRoute4(p: { gateway: number; oif: number; ifName: string }): NlRequest {
  const header = new Uint8Array(RTMSG_LEN);
  header.set([AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST]);
  return {
    type: RTM_NEWROUTE,
    flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
    header,
    attrs: [attrIpv4(RTA_GATEWAY, p.gateway), attrU32(RTA_OIF, p.oif)],
    what: `adding default route via ${ipv4Text(p.gateway)} dev ${p.ifName}`,
  };
}

const ipv4Text = (n: number) => `${(n >>> 24) & 255}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;

// ---------------------------------------------------------------------------------------------------------------
// Decoding

export interface NlMessage {
  readonly type: number;
  readonly flags: number;
  readonly seq: number;
  readonly pid: number;
  /** Everything after the netlink header. */
  readonly payload: Uint8Array;
}

/** A kernel answer that does not decode: a kernel that speaks netlink differently from the layouts above, or a bug here. */
function malformed(what: string) {
  return atollError('KERNEL_OP_FAILED', `${what}: an answer of the kernel's that Atoll cannot decode`,
    'report it with the kernel version (uname -r): Atoll does not know this layout');
}

/**
 * Splits a received datagram into messages.
 * @throws AtollError KERNEL_OP_FAILED when a length field points outside the buffer (a truncated read).
 */
export function decodeMessages(buf: Uint8Array): NlMessage[] {
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const out: NlMessage[] = [];
  let at = 0;
  while (at + NLMSG_HDRLEN <= buf.length) {
    const len = view.getUint32(at, LE);
    if (len < NLMSG_HDRLEN || at + len > buf.length) throw malformed(`netlink message at offset ${at} claims ${len} bytes, ${buf.length - at} left`);
    out.push({ type: view.getUint16(at + 4, LE), flags: view.getUint16(at + 6, LE), seq: view.getUint32(at + 8, LE), pid: view.getUint32(at + 12, LE), payload: buf.subarray(at + NLMSG_HDRLEN, at + len) });
    at += align4(len);
  }
  return out;
}

/** Attributes of a payload from `offset`, by type (flags masked off); the last of a repeated type wins. */
export function decodeAttrs(payload: Uint8Array, offset: number): Map<number, Uint8Array> {
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const out = new Map<number, Uint8Array>();
  let at = offset;
  while (at + 4 <= payload.length) {
    const len = view.getUint16(at, LE);
    if (len < 4 || at + len > payload.length) break;
    out.set(view.getUint16(at + 2, LE) & NLA_TYPE_MASK, payload.subarray(at + 4, at + len));
    at += align4(len);
  }
  return out;
}

/** The outcome of an NLMSG_ERROR message: errno 0 is a plain ack. */
export interface NlAck {
  /** Positive errno (the kernel sends it negated), 0 for success. */
  readonly errno: number;
  /** Sequence number of the request answered, from the echoed header. */
  readonly seq: number;
  /** The kernel's extended-ack text, when it gave one. */
  readonly message?: string;
}

/** Decodes an NLMSG_ERROR message (with or without the echoed request, with or without extended-ack TLVs). */
export function decodeAck(msg: NlMessage): NlAck {
  const p = msg.payload;
  if (p.length < 4 + NLMSG_HDRLEN) throw malformed(`netlink error message of ${p.length} bytes is too short`);
  const view = new DataView(p.buffer, p.byteOffset, p.byteLength);
  const errno = -view.getInt32(0, LE) | 0; // | 0: no -0 for a plain ack
  const origLen = view.getUint32(4, LE);
  const seq = view.getUint32(4 + 8, LE);
  if (!(msg.flags & NLM_F_ACK_TLVS)) return { errno, seq };
  const tlvStart = 4 + (msg.flags & NLM_F_CAPPED ? NLMSG_HDRLEN : align4(origLen));
  const text = decodeAttrs(p, tlvStart).get(NLMSGERR_ATTR_MSG);
  return text ? { errno, seq, message: cString(text) } : { errno, seq };
}

function cString(b: Uint8Array): string {
  const end = b.indexOf(0);
  return String.fromCharCode(...(end < 0 ? b : b.subarray(0, end)));
}

export interface LinkInfo {
  /** ifi_family: AF_UNSPEC for the link itself; AF_BRIDGE in a bridge's notices about its ports. */
  readonly family: number;
  readonly index: number;
  readonly flags: number;
  readonly name: string;
  readonly mtu?: number;
  readonly mac?: string;
  /** ifindex of the master (a bridge), when enslaved. */
  readonly master?: number;
  /** IFLA_LINK: for a veth, the ifindex of its peer (in the peer's namespace). */
  readonly link?: number;
  /** IFLA_INFO_KIND, e.g. "veth", "bridge". */
  readonly kind?: string;
  /** For a VXLAN device (kind "vxlan"): its VNI, local address, UDP port and whether it learns fdb entries. */
  readonly vxlan?: { readonly id?: number; readonly local?: string; readonly port?: number; readonly learning?: boolean };
}

/** Decodes an RTM_NEWLINK answer (to RTM_GETLINK). */
export function decodeLink(msg: NlMessage): LinkInfo {
  const p = msg.payload;
  if (p.length < IFINFOMSG_LEN) throw malformed(`link message of ${p.length} bytes is too short`);
  const view = new DataView(p.buffer, p.byteOffset, p.byteLength);
  const a = decodeAttrs(p, IFINFOMSG_LEN);
  const u32 = (t: number) => u32Of(a.get(t));
  const name = a.get(IFLA_IFNAME);
  const mac = a.get(IFLA_ADDRESS);
  const info = a.get(IFLA_LINKINFO);
  const kind = info && decodeAttrs(info, 0).get(IFLA_INFO_KIND);
  const link: { -readonly [K in keyof LinkInfo]: LinkInfo[K] } = { family: p[0] as number, index: view.getInt32(4, LE), flags: view.getUint32(8, LE), name: name ? cString(name) : '' };
  const mtu = u32(IFLA_MTU);
  const master = u32(IFLA_MASTER);
  const peer = u32(IFLA_LINK);
  if (mtu !== undefined) link.mtu = mtu;
  if (mac && mac.length === 6) link.mac = formatMac(mac);
  if (master !== undefined) link.master = master;
  if (peer !== undefined) link.link = peer;
  if (kind) link.kind = cString(kind);
  const data = info && decodeAttrs(info, 0).get(IFLA_INFO_DATA);
  if (link.kind === 'vxlan' && data) {
    const d = decodeAttrs(data, 0);
    const id = u32Of(d.get(IFLA_VXLAN_ID));
    const local = d.get(IFLA_VXLAN_LOCAL);
    const port = d.get(IFLA_VXLAN_PORT);
    const learning = d.get(IFLA_VXLAN_LEARNING);
    link.vxlan = {
      ...(id === undefined ? {} : { id }),
      ...(local && local.length === 4 ? { local: ipText(local) } : {}),
      ...(port && port.length >= 2 ? { port: new DataView(port.buffer, port.byteOffset, 2).getUint16(0, false) } : {}), // network order
      ...(learning && learning.length >= 1 ? { learning: learning[0] !== 0 } : {}),
    };
  }
  return link;
}

/** Four or sixteen address bytes as text ("10.0.0.1"; IPv6 as eight hexadecimal groups, uncompressed). */
function ipText(b: Uint8Array): string {
  if (b.length === 4) return `${b[0]}.${b[1]}.${b[2]}.${b[3]}`;
  const groups: string[] = [];
  for (let i = 0; i + 1 < b.length; i += 2) groups.push((((b[i] as number) << 8) | (b[i + 1] as number)).toString(16));
  return groups.join(':');
}

function u32Of(b: Uint8Array | undefined): number | undefined {
  return b && b.length >= 4 ? new DataView(b.buffer, b.byteOffset, 4).getUint32(0, LE) : undefined;
}

function fixedHeader(msg: NlMessage, len: number, what: string): DataView {
  if (msg.payload.length < len) throw malformed(`${what} message of ${msg.payload.length} bytes is too short`);
  return new DataView(msg.payload.buffer, msg.payload.byteOffset, msg.payload.byteLength);
}

export interface AddrInfo {
  readonly family: number;
  readonly index: number;
  readonly prefixLen: number;
  /** IFA_LOCAL (the interface's own address; IFA_ADDRESS where there is no IFA_LOCAL), as text. */
  readonly local: string;
}

/** Decodes an RTM_NEWADDR answer (to an address dump). */
export function decodeAddr(msg: NlMessage): AddrInfo {
  const view = fixedHeader(msg, IFADDRMSG_LEN, 'address');
  const p = msg.payload;
  const a = decodeAttrs(p, IFADDRMSG_LEN);
  const local = a.get(IFA_LOCAL) ?? a.get(IFA_ADDRESS);
  return { family: p[0] as number, prefixLen: p[1] as number, index: view.getUint32(4, LE), local: local ? ipText(local) : '' };
}

export interface RouteInfo {
  readonly family: number;
  /** "10.1.2.0/24"; a host route "10.1.2.3/32"; the default route "0.0.0.0/0". */
  readonly dst: string;
  readonly gateway?: string;
  /** Output interface index. */
  readonly oif?: number;
  /** RTA_TABLE when present (tables past 255), else rtm_table. */
  readonly table: number;
  readonly protocol: number;
  readonly scope: number;
  readonly type: number;
  readonly onlink: boolean;
}

/** Decodes an RTM_NEWROUTE answer (to a route dump). Multipath routes give only their first fields (Atoll sets none). */
export function decodeRoute(msg: NlMessage): RouteInfo {
  const view = fixedHeader(msg, RTMSG_LEN, 'route');
  const p = msg.payload;
  const a = decodeAttrs(p, RTMSG_LEN);
  const dst = a.get(RTA_DST);
  const gateway = a.get(RTA_GATEWAY);
  const oif = u32Of(a.get(RTA_OIF));
  const family = p[0] as number;
  return {
    family,
    dst: `${dst ? ipText(dst) : family === AF_INET ? '0.0.0.0' : '::'}/${p[1] as number}`,
    ...(gateway ? { gateway: ipText(gateway) } : {}),
    ...(oif === undefined ? {} : { oif }),
    table: u32Of(a.get(RTA_TABLE)) ?? (p[4] as number),
    protocol: p[5] as number,
    scope: p[6] as number,
    type: p[7] as number,
    onlink: (view.getUint32(8, LE) & RTNH_F_ONLINK) !== 0,
  };
}

export interface NeighInfo {
  readonly family: number;
  readonly index: number;
  /** NUD_* bits. */
  readonly state: number;
  /** NTF_* bits. */
  readonly flags: number;
  /** NDA_DST: the neighbour's IP; in a VXLAN device's fdb entry, the remote VTEP's. */
  readonly dst?: string;
  /** NDA_LLADDR: the MAC. */
  readonly lladdr?: string;
}

/** Decodes an RTM_NEWNEIGH answer (to a neighbour or fdb dump). */
export function decodeNeigh(msg: NlMessage): NeighInfo {
  const view = fixedHeader(msg, NDMSG_LEN, 'neighbour');
  const p = msg.payload;
  const a = decodeAttrs(p, NDMSG_LEN);
  const dst = a.get(NDA_DST);
  const lladdr = a.get(NDA_LLADDR);
  return {
    family: p[0] as number,
    index: view.getInt32(4, LE),
    state: view.getUint16(8, LE),
    flags: p[10] as number,
    ...(dst && (dst.length === 4 || dst.length === 16) ? { dst: ipText(dst) } : {}),
    ...(lladdr && lladdr.length === 6 ? { lladdr: formatMac(lladdr) } : {}),
  };
}

/** The outcome a dump's NLMSG_DONE carries: 0, or the positive errno of a dump that failed part-way. */
export function decodeDone(msg: NlMessage): number {
  const p = msg.payload;
  if (p.length < 4) return 0;
  return -new DataView(p.buffer, p.byteOffset, 4).getInt32(0, LE) | 0;
}

/** Decodes NFT_MSG_NEWGEN: the ruleset generation, which every committed nftables transaction in the namespace raises by one. */
export function decodeGeneration(msg: NlMessage): number {
  if (msg.type !== NFT_MSG_NEWGEN) throw malformed(`expected an nftables generation message, got type ${msg.type}`);
  const id = decodeAttrs(msg.payload, NFGENMSG_LEN).get(NFTA_GEN_ID);
  if (!id || id.length < 4) throw malformed('nftables generation message without NFTA_GEN_ID');
  return new DataView(id.buffer, id.byteOffset, 4).getUint32(0, false); // network order
}
