/* A hostile "CUDA process" for the security tests: it answers (or not) on the interposer's
 * control socket in $MQFQ_CTL_DIR the way an attacker inside a container would.
 *
 *   hostile_ctl symlink <host socket>   plant cuda-1.sock -> <host socket>, then sleep
 *   hostile_ctl stall                   accept, read, never answer
 *   hostile_ctl flood                   answer every connection with endless bytes, no newline
 *   hostile_ctl lie                     answer "ok" and absurd byte counts
 *   hostile_ctl fill                    make entries until the directory refuses, then sleep
 *   hostile_ctl burst <hold_ms> <idle>  speak the shim's burst socket itself: begin, hold the
 *                                       lease hold_ms, end claiming <idle> ns idle, again at once
 *
 * Built static (cc -static), so the preloaded interposer never loads into it. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char *dir(void) {
    const char *d = getenv("MQFQ_CTL_DIR");
    return d ? d : "/run/mqfq/ctl";
}

static int listen_on(const char *name) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir(), name);
    unlink(a.sun_path);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0) {
        perror("hostile_ctl: listen");
        exit(1);
    }
    return s;
}

/* Sends one request and reads its one-line answer: 0 for "ok", 1 for anything else, -1 when
 * the shim hung up. */
static int say(int s, const char *req) {
    size_t len = strlen(req), off = 0;
    while (off < len) {
        ssize_t w = write(s, req + off, len - off);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    char line[128];
    size_t n = 0;
    for (;;) {
        char c;
        if (read(s, &c, 1) <= 0) return -1;
        if (c == '\n') break;
        if (n < sizeof line - 1) line[n++] = c;
    }
    line[n] = 0;
    return strcmp(line, "ok") == 0 ? 0 : 1;
}

static void forever(void) {
    for (;;) pause();
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) return 2;
    const char *mode = argv[1];
    char name[64];
    snprintf(name, sizeof name, "cuda-%d.sock", (int)getpid());
    if (!strcmp(mode, "symlink") && argc > 2) {
        char p[200];
        snprintf(p, sizeof p, "%s/cuda-1.sock", dir());
        if (symlink(argv[2], p) < 0) perror("hostile_ctl: symlink");
        printf("planted\n");
        fflush(stdout);
        forever();
    }
    if (!strcmp(mode, "fill")) {
        int n = 0;
        for (;; n++) {
            char p[200];
            snprintf(p, sizeof p, "%s/f%d", dir(), n);
            int fd = open(p, O_CREAT | O_WRONLY, 0644);
            if (fd < 0) break;
            close(fd);
        }
        printf("filled %d\n", n);
        fflush(stdout);
        forever();
    }
    if (!strcmp(mode, "burst")) {
        if (argc != 4 || strlen(argv[3]) > 20) {
            fprintf(stderr, "usage: hostile_ctl burst <hold_ms> <idle_ns>\n");
            return 2;
        }
        long hold_ms = atol(argv[2]);
        char end[64];
        snprintf(end, sizeof end, "end %s\n", argv[3]);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s/shim.sock", dir());
        int b = socket(AF_UNIX, SOCK_STREAM, 0);
        if (b < 0 || connect(b, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("hostile_ctl: connect");
            return 1;
        }
        printf("bursting\n");
        fflush(stdout);
        for (;;) {
            int r = say(b, "begin\n");
            if (r < 0) return 1;
            if (r > 0) { /* refused: not holding the lease, try again shortly */
                usleep(10000);
                continue;
            }
            usleep((useconds_t)hold_ms * 1000);
            if (say(b, end) < 0) return 1;
        }
    }
    int s = listen_on(name);
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        if (!strcmp(mode, "stall")) {
            continue; /* kept open, never answered */
        }
        if (!strcmp(mode, "flood")) {
            char junk[4096];
            memset(junk, 'x', sizeof junk);
            if (fork() == 0) {
                while (write(c, junk, sizeof junk) > 0) {
                }
                _exit(0);
            }
            close(c);
            continue;
        }
        /* lie */
        char buf[512];
        ssize_t n;
        while ((n = read(c, buf, sizeof buf)) > 0) {
            const char *r = strncmp(buf, "hello", 5) == 0
                ? "ok\n"
                : "ok managed=18446744073709551615 resident=18446744073709551615 "
                  "evicted=18446744073709551615 prefetched=18446744073709551615\n";
            if (write(c, r, strlen(r)) < 0) break;
        }
        close(c);
    }
}
