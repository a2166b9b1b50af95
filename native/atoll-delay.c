/*
 * atoll-delay: the lab's uplink delay line, for kernels without netem (CONFIG_NET_SCH_NETEM).
 *
 *   atoll-delay DELAY_MS TAP_A TAP_B [TAG]
 *
 * TAG is not used: the lab passes its run's directory, so that `atoll lab down` recognises the process as its own.
 *
 * `atoll lab up` splices a namespace into an edge uplink (src/lab/plan/plan.ts, LabDelayLine): two bridges, each
 * joining one side of the link with a persistent TAP device made with vnet_hdr. This program attaches to both TAP
 * devices and moves every frame read from one to the other DELAY_MS later, in order, both directions: a wire with a
 * constant one-way delay, as netem on both ends of the link gives. Rates stay with tbf on the link's ends.
 *
 * Why native: a Node.js version kept up with TCP superpackets but not with a segmented flow (a VXLAN reference at
 * 1 Gbit/s is 80 000 frames a second each way): it used 80% of a core and its queues grew the round trip from 40 to
 * 400 ms, so the emulator, not the link, limited the reference. Frames wait in a byte ring per direction (no
 * allocation); the TAP devices carry the virtio-net header with offloads, so superpackets cross whole.
 *
 * Prints "delay line ready: ..." once attached; runs until SIGTERM or SIGINT (or a TAP device goes away), then
 * prints its counters.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* Bytes of frames in flight per direction: 1 Gbit/s for half a second. */
#define RING_BYTES (64u << 20)
/* The largest frame a TAP read returns: a 64 KiB superpacket, its Ethernet header and the virtio-net header. */
#define MAX_FRAME (65536u + 64u)
#define ALIGN8(n) (((n) + 7u) & ~(size_t)7u)

struct rec {
    uint64_t due_ns;
    uint32_t len;
    uint32_t wrap; /* 1: no frame here, the next record is at offset 0 */
};

struct dir {
    int from, to;
    uint8_t *ring;
    size_t head, tail, count;
    unsigned long long frames, bytes, dropped_full, write_errors;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int attach(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "atoll-delay: opening /dev/net/tun: %s\n", strerror(errno));
        return -1;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    if (strlen(name) >= IFNAMSIZ) {
        fprintf(stderr, "atoll-delay: device name %s is longer than %d bytes\n", name, IFNAMSIZ - 1);
        close(fd);
        return -1;
    }
    strcpy(ifr.ifr_name, name);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if (ioctl(fd, TUNSETIFF, &ifr) < 0 || ioctl(fd, TUNSETOFFLOAD, (unsigned long)(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)) < 0) {
        fprintf(stderr, "atoll-delay: attaching to TAP device %s: %s (it must exist, made with vnet_hdr)\n", name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Where the next frame (up to MAX_FRAME bytes) goes, or NULL when the ring is full. */
static struct rec *reserve(struct dir *d) {
    size_t need = ALIGN8(sizeof(struct rec) + MAX_FRAME);
    if (d->count == 0) d->head = d->tail = 0;
    if (d->count == 0 || d->tail > d->head) {
        if (RING_BYTES - d->tail >= need) return (struct rec *)(d->ring + d->tail);
        if (d->head > need) { /* wrap: mark the end (too little room for a marker says the same), continue at 0 */
            if (RING_BYTES - d->tail >= sizeof(struct rec)) {
                ((struct rec *)(d->ring + d->tail))->wrap = 1;
                d->count++; /* the marker counts as a record until it is passed */
            }
            d->tail = 0;
            return (struct rec *)d->ring;
        }
        return NULL;
    }
    return d->head - d->tail > need ? (struct rec *)(d->ring + d->tail) : NULL;
}

static void read_all(struct dir *d, uint64_t delay_ns) {
    static uint8_t scratch[MAX_FRAME];
    for (;;) {
        struct rec *r = reserve(d);
        uint8_t *buf = r ? (uint8_t *)(r + 1) : scratch;
        ssize_t n = read(d->from, buf, MAX_FRAME);
        if (n <= 0) return; /* EAGAIN: drained */
        if (!r) {
            d->dropped_full++;
            continue;
        }
        r->due_ns = now_ns() + delay_ns;
        r->len = (uint32_t)n;
        r->wrap = 0;
        d->tail += ALIGN8(sizeof(struct rec) + (size_t)n);
        d->count++;
    }
}

/* Writes every frame that is due; returns when the next one is due (0: none waiting). */
static uint64_t flush(struct dir *d, uint64_t now) {
    while (d->count > 0) {
        if (RING_BYTES - d->head < sizeof(struct rec)) d->head = 0; /* an end too short for a marker */
        struct rec *r = (struct rec *)(d->ring + d->head);
        if (r->wrap) {
            d->head = 0;
            d->count--;
            continue;
        }
        if (r->due_ns > now) return r->due_ns;
        if (write(d->to, r + 1, r->len) < 0) d->write_errors++;
        else {
            d->frames++;
            d->bytes += r->len;
        }
        d->head += ALIGN8(sizeof(struct rec) + r->len);
        d->count--;
    }
    return 0;
}

int main(int argc, char **argv) {
    if ((argc != 4 && argc != 5) || atoi(argv[1]) < 1 || atoi(argv[1]) > 10000) {
        fprintf(stderr, "usage: atoll-delay DELAY_MS TAP_A TAP_B [TAG] (DELAY_MS 1..10000; run by `atoll lab up`)\n");
        return 2;
    }
    uint64_t delay_ns = (uint64_t)atoi(argv[1]) * 1000000ull;
    int a = attach(argv[2]), b = attach(argv[3]);
    if (a < 0 || b < 0) return 1;
    struct dir dirs[2] = {{.from = a, .to = b}, {.from = b, .to = a}};
    for (int i = 0; i < 2; i++) {
        dirs[i].ring = malloc(RING_BYTES);
        if (!dirs[i].ring) {
            fprintf(stderr, "atoll-delay: no memory for a %u-byte ring\n", RING_BYTES);
            return 1;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("delay line ready: %s ms between %s and %s\n", argv[1], argv[2], argv[3]);
    fflush(stdout);

    struct pollfd fds[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    while (!stop) {
        uint64_t now = now_ns(), next = 0;
        for (int i = 0; i < 2; i++) {
            uint64_t due = flush(&dirs[i], now);
            if (due && (!next || due < next)) next = due;
        }
        struct timespec wait = {0, 0};
        if (next) {
            uint64_t left = next > now ? next - now : 0;
            wait.tv_sec = (time_t)(left / 1000000000ull);
            wait.tv_nsec = (long)(left % 1000000000ull);
        }
        int rc = ppoll(fds, 2, next ? &wait : NULL, NULL);
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "atoll-delay: poll: %s\n", strerror(errno));
            return 1;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].revents & POLLIN) read_all(&dirs[i], delay_ns);
            if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) {
                fprintf(stderr, "atoll-delay: TAP device %s went away\n", argv[2 + i]);
                stop = 1;
            }
        }
    }
    for (int i = 0; i < 2; i++) {
        printf("delay line %s -> %s: %llu frames, %llu bytes, %llu dropped (ring full), %llu write errors\n", argv[2 + i], argv[3 - i],
               dirs[i].frames, dirs[i].bytes, dirs[i].dropped_full, dirs[i].write_errors);
    }
    return 0;
}
