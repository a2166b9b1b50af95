/**
 * libc through koffi, for every FFI user: the one place that opens libc.so.6 (lint fails a `load` of libc anywhere
 * else). Atoll's own library, bin/libatoll-dp.so, is opened by src/adapters/tunnel/native-library.ts.
 *
 * Why one module: the calls each part makes into libc (netlink sockets, setns, the TUN device, the tunnel's UDP
 * batches, malloc_trim) are declared here, typed, beside each other, so their prototypes are read in one place and
 * the library is opened once. Each group is declared on first use (nothing is loaded until a caller needs it, as
 * before) and kept. The prototypes are each caller's own: netlink hands Buffers as `const void *` and waits on libuv's
 * pool (`.async`), the UDP batches pass `const uint8_t *` and malloc'd rings; so `bind`, `setsockopt` and `close` are
 * declared once per group, as their callers have always declared them.
 *
 * Errors: a missing libc or symbol throws from koffi at first use of its group; errno after a call is `koffi.errno()`.
 */
import koffi from 'koffi';

type Library = ReturnType<typeof koffi.load>;
let library: Library | undefined;

/** libc.so.6, opened on first use. */
function libc(): Library {
  library ??= koffi.load('libc.so.6');
  return library;
}

type Callback<T> = (err: unknown, res: T) => void;
/** A call that can also run on libuv's pool: `fn.async(...args, callback)`. */
export interface AsyncFn<A extends unknown[], R> {
  (...args: A): R;
  async: (...args: [...A, Callback<R>]) => void;
}

/** Netlink sockets (src/adapters/kernel/netlink.ts, link-watch.ts): sends and receives may wait in the kernel, on libuv's pool. */
export interface NetlinkCalls {
  socket: AsyncFn<[number, number, number], number>;
  bind: AsyncFn<[number, Buffer, number], number>;
  setsockopt: AsyncFn<[number, number, number, Buffer, number], number>;
  send: AsyncFn<[number, Uint8Array, number, number], number>;
  recv: AsyncFn<[number, Buffer, number, number], number>;
  close: AsyncFn<[number], number>;
}

/** The numbers both netlink users pass to those calls (Linux's, on every architecture Atoll runs on). */
export const NETLINK = Object.freeze({
  AF_NETLINK: 16, SOCK_RAW: 3, SOCK_CLOEXEC: 0o2000000, NETLINK_ROUTE: 0, SOL_SOCKET: 1, SO_RCVTIMEO: 20, EAGAIN: 11, EINTR: 4,
});

let netlink: NetlinkCalls | undefined;

/** The netlink socket calls, declared on first use. */
export function netlinkCalls(): NetlinkCalls {
  if (netlink) return netlink;
  const lib = libc();
  netlink = {
    socket: lib.func('int socket(int domain, int type, int protocol)') as NetlinkCalls['socket'],
    bind: lib.func('int bind(int fd, const void *addr, uint32_t len)') as NetlinkCalls['bind'],
    setsockopt: lib.func('int setsockopt(int fd, int level, int optname, const void *optval, uint32_t optlen)') as NetlinkCalls['setsockopt'],
    send: lib.func('intptr_t send(int fd, const void *buf, size_t len, int flags)') as NetlinkCalls['send'],
    recv: lib.func('intptr_t recv(int fd, _Out_ void *buf, size_t len, int flags)') as NetlinkCalls['recv'],
    close: lib.func('int close(int fd)') as NetlinkCalls['close'],
  };
  return netlink;
}

/** The TUN device (src/adapters/tunnel/tun.ts): open, its ioctls, non-blocking reads and writes. */
export interface TunCalls {
  open: (path: string, flags: number) => number;
  ioctlPtr: (fd: number, req: number, arg: Buffer) => number;
  ioctlVal: (fd: number, req: number, arg: number) => number;
  read: (fd: number, buf: Uint8Array, len: number) => number;
  write: (fd: number, buf: Uint8Array, len: number) => number;
  close: (fd: number) => number;
}

let tun: TunCalls | undefined;

/** The TUN device's calls, declared on first use. */
export function tunCalls(): TunCalls {
  if (tun) return tun;
  const lib = libc();
  tun = {
    open: lib.func('int open(const char *path, int flags)') as TunCalls['open'],
    ioctlPtr: lib.func('ioctl', 'int', ['int', 'unsigned long', 'void *']) as TunCalls['ioctlPtr'],
    ioctlVal: lib.func('ioctl', 'int', ['int', 'unsigned long', 'unsigned long']) as TunCalls['ioctlVal'],
    read: lib.func('intptr_t read(int fd, _Out_ void *buf, size_t len)') as TunCalls['read'],
    write: lib.func('intptr_t write(int fd, const void *buf, size_t len)') as TunCalls['write'],
    close: lib.func('int close(int fd)') as TunCalls['close'],
  };
  return tun;
}

/** The tunnel's UDP socket (src/adapters/tunnel/udp-batch.ts): a malloc'd `recvmmsg` ring, waits on libuv's pool. */
export interface UdpCalls {
  malloc: (n: number) => unknown;
  free: (p: unknown) => void;
  socket: (domain: number, type: number, protocol: number) => number;
  setsockopt: (fd: number, level: number, name: number, value: Int32Array, len: number) => number;
  bind: (fd: number, addr: Uint8Array, len: number) => number;
  getsockname: (fd: number, addr: Uint8Array, len: Int32Array) => number;
  sendto: (fd: number, buf: Uint8Array, len: number, flags: number, addr: Uint8Array, addrLen: number) => number;
  recvmmsg: (fd: number, vec: unknown, vlen: number, flags: number, timeout: null) => number;
  usleep: { async: (us: number, cb: (err: unknown, rc: number) => void) => void };
  poll: { async: (fds: unknown, n: number, timeout: number, cb: (err: unknown, rc: number) => void) => void };
  shutdown: (fd: number, how: number) => number;
  close: (fd: number) => number;
}

let udp: UdpCalls | undefined;

/** The UDP batches' calls, declared on first use. */
export function udpCalls(): UdpCalls {
  if (udp) return udp;
  const lib = libc();
  udp = {
    malloc: lib.func('void *malloc(size_t n)') as UdpCalls['malloc'],
    free: lib.func('void free(void *p)') as UdpCalls['free'],
    socket: lib.func('int socket(int domain, int type, int protocol)') as UdpCalls['socket'],
    setsockopt: lib.func('int setsockopt(int fd, int level, int name, const int *value, int len)') as UdpCalls['setsockopt'],
    bind: lib.func('int bind(int fd, const uint8_t *addr, int len)') as UdpCalls['bind'],
    getsockname: lib.func('int getsockname(int fd, _Out_ uint8_t *addr, _Inout_ int *len)') as UdpCalls['getsockname'],
    sendto: lib.func('intptr_t sendto(int fd, const uint8_t *buf, size_t len, int flags, const uint8_t *addr, int addrlen)') as UdpCalls['sendto'],
    recvmmsg: lib.func('int recvmmsg(int fd, void *vec, unsigned int vlen, int flags, void *timeout)') as UdpCalls['recvmmsg'],
    usleep: lib.func('int usleep(unsigned int us)') as unknown as UdpCalls['usleep'],
    poll: lib.func('int poll(void *fds, unsigned long nfds, int timeout)') as unknown as UdpCalls['poll'],
    shutdown: lib.func('int shutdown(int fd, int how)') as UdpCalls['shutdown'],
    close: lib.func('int close(int fd)') as UdpCalls['close'],
  };
  return udp;
}

/** `setns(2)`: switches the calling thread's namespace (src/adapters/kernel/netns.ts). */
export type SetnsFn = (fd: number, nstype: number) => number;
let setns: SetnsFn | undefined;

/** `setns`, declared on first use. */
export function setnsCall(): SetnsFn {
  setns ??= libc().func('int setns(int fd, int nstype)') as SetnsFn;
  return setns;
}

/**
 * glibc's `malloc_trim` (src/adapters/ops/malloc-trim.ts), declared on each call: throws where libc has no such
 * symbol (not glibc), which the caller turns into "do nothing".
 */
export function mallocTrimCall(): (pad: number) => number {
  return libc().func('int malloc_trim(size_t pad)') as (pad: number) => number;
}

/** The C heap and `fcntl`, for tests that look at what the callers above leave behind. */
export interface TestCalls {
  malloc: (n: number) => unknown;
  free: (p: unknown) => void;
  memset: (p: unknown, c: number, n: number) => unknown;
  fcntl: (fd: number, cmd: number, arg: number) => number;
}

/** Test-only calls (malloc-trim.test.ts, splice-native.test.ts), declared on each call. */
export function testCalls(): TestCalls {
  const lib = libc();
  return {
    malloc: lib.func('void *malloc(size_t n)') as TestCalls['malloc'],
    free: lib.func('void free(void *p)') as TestCalls['free'],
    memset: lib.func('void *memset(void *p, int c, size_t n)') as TestCalls['memset'],
    fcntl: lib.func('int fcntl(int fd, int cmd, int arg)') as TestCalls['fcntl'],
  };
}
