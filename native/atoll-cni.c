/*
 * atoll-cni: the CNI executable. A deliberately tiny native shim (see docs/architecture.md, "Why the CNI
 * executable is native"): it forwards the CNI_* environment and stdin to the node agent over a unix socket and
 * prints the agent's answer. All CNI logic lives in TypeScript (src/agent/cni-handler.ts); the wire format is src/core/cni-spec/shim-protocol.ts.
 *
 * The only decisions made here are what to print when the agent cannot be reached: the spec's error object with
 * code 11 (try again later), or 50 (not available) for STATUS; and VERSION, which needs no agent, is answered
 * from the static list below.
 *
 * The agent's socket: the "agentSocket" string of the network configuration, else $ATOLL_AGENT_SOCKET, else
 * /run/atoll/atoll.sock.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_STDIN (1u << 20)
#define MAX_ENV (64u * 1024u)
#define DEFAULT_SOCKET "/run/atoll/atoll.sock"
#define IO_TIMEOUT_SEC 300
/* Kept equal to SUPPORTED_CNI_VERSIONS in src/core/cni-spec/model.ts by test/docs.test.ts. */
#define SUPPORTED_VERSIONS "\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\""

extern char **environ;

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Copies the JSON string value of the first "key" in buf into out (no escapes allowed); 0 on success. */
static int json_string(const char *buf, size_t len, const char *key, char *out, size_t outlen) {
  size_t klen = strlen(key);
  for (size_t i = 0; i + klen + 2 <= len; i++) {
    if (buf[i] != '"' || memcmp(buf + i + 1, key, klen) != 0 || buf[i + 1 + klen] != '"') continue;
    size_t j = i + klen + 2;
    while (j < len && (buf[j] == ' ' || buf[j] == '\t' || buf[j] == '\n' || buf[j] == '\r')) j++;
    if (j >= len || buf[j] != ':') continue;
    j++;
    while (j < len && (buf[j] == ' ' || buf[j] == '\t' || buf[j] == '\n' || buf[j] == '\r')) j++;
    if (j >= len || buf[j] != '"') return -1;
    j++;
    size_t o = 0;
    while (j < len && buf[j] != '"') {
      if (buf[j] == '\\' || o + 1 >= outlen) return -1;
      out[o++] = buf[j++];
    }
    if (j >= len) return -1;
    out[o] = '\0';
    return 0;
  }
  return -1;
}

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static int unreachable(const char *in, size_t inlen, const char *sock, const char *why) {
  char version[32] = "1.1.0";
  char v[32];
  if (json_string(in, inlen, "cniVersion", v, sizeof v) == 0 && strspn(v, "0123456789.") == strlen(v)) {
    memcpy(version, v, sizeof version);
  }
  const char *cmd = getenv("CNI_COMMAND");
  if (cmd && strcmp(cmd, "VERSION") == 0) {
    printf("{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[" SUPPORTED_VERSIONS "]}\n");
    return 0;
  }
  int code = (cmd && strcmp(cmd, "STATUS") == 0) ? 50 : 11;
  printf("{\"cniVersion\":\"%s\",\"code\":%d,\"msg\":\"atoll agent unreachable at %s: %s\","
         "\"details\":\"fix: start the atoll agent on this node (atoll agent --config FILE); atoll code AGENT_UNREACHABLE\"}\n",
         version, code, sock, why);
  return 1;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);

  size_t cap = 64 * 1024, inlen = 0;
  char *in = malloc(cap);
  if (!in) return 1;
  for (;;) {
    if (inlen == cap) {
      cap *= 2;
      if (cap > MAX_STDIN + 1) cap = MAX_STDIN + 1;
      char *n = realloc(in, cap);
      if (!n) return 1;
      in = n;
    }
    ssize_t r = read(0, in + inlen, cap - inlen);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    inlen += (size_t)r;
    if (inlen > MAX_STDIN) break; /* the agent refuses oversized input with the right code */
  }

  static unsigned char env[MAX_ENV];
  size_t envlen = 0;
  for (char **e = environ; *e; e++) {
    if (strncmp(*e, "CNI_", 4) != 0) continue;
    size_t l = strlen(*e) + 1;
    if (envlen + l > MAX_ENV) break;
    memcpy(env + envlen, *e, l);
    envlen += l;
  }

  char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
  const char *fromenv = getenv("ATOLL_AGENT_SOCKET");
  if (json_string(in, inlen, "agentSocket", sock, sizeof sock) != 0) {
    snprintf(sock, sizeof sock, "%s", fromenv && *fromenv ? fromenv : DEFAULT_SOCKET);
  }

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return unreachable(in, inlen, sock, strerror(errno));
  struct timeval tv = {IO_TIMEOUT_SEC, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  memcpy(addr.sun_path, sock, strlen(sock) + 1);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) return unreachable(in, inlen, sock, strerror(errno));

  unsigned char head[8] = {'A', 'T', 'L', '1'};
  unsigned char len4[4];
  put_u32(head + 4, (uint32_t)envlen);
  put_u32(len4, (uint32_t)inlen);
  if (write_all(fd, head, 8) || write_all(fd, env, envlen) || write_all(fd, len4, 4) || write_all(fd, in, inlen)) {
    return unreachable(in, inlen, sock, "the agent closed the connection while receiving the request");
  }
  shutdown(fd, SHUT_WR);

  unsigned char rhead[8];
  if (read_all(fd, rhead, 8)) return unreachable(in, inlen, sock, "the agent closed the connection before answering");
  uint32_t code = get_u32(rhead), outlen = get_u32(rhead + 4);
  char *out = malloc((size_t)outlen + 1);
  unsigned char elen4[4];
  if (!out || read_all(fd, out, outlen) || read_all(fd, elen4, 4)) {
    return unreachable(in, inlen, sock, "the agent's answer was cut short");
  }
  uint32_t errlen = get_u32(elen4);
  char *err = malloc((size_t)errlen + 1);
  if (!err || read_all(fd, err, errlen)) return unreachable(in, inlen, sock, "the agent's answer was cut short");
  write_all(1, out, outlen);
  write_all(2, err, errlen);
  return (int)(code > 255 ? 1 : code);
}
