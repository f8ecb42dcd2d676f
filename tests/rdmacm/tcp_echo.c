/* A plain TCP program (no rsocket calls) for conf_cm_rspreload_tcp: the server receives
 * N bytes from the client, checks the pattern, replies "ok" and expects EOF when the client
 * closes. Run under librspreload.so, every socket call becomes an rsocket one. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#define N 300000
static unsigned char pat(size_t i) { return (unsigned char)(i * 7 + (i >> 10)); }
int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s s|c IP PORT\n", argv[0]);
    return 2;
  }
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons(atoi(argv[3]));
  inet_pton(AF_INET, argv[2], &a.sin_addr);
  static unsigned char buf[N];
  if (argv[1][0] == 's') {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1)) { perror("bind/listen"); return 1; }
    int c = accept(l, NULL, NULL);
    if (c < 0) { perror("accept"); return 1; }
    size_t got = 0;
    while (got < N) {
      struct pollfd p = {c, POLLIN, 0};
      if (poll(&p, 1, 10000) != 1) { fprintf(stderr, "poll timeout\n"); return 1; }
      ssize_t r = recv(c, buf + got, N - got, 0);
      if (r <= 0) { perror("recv"); return 1; }
      got += (size_t)r;
    }
    for (size_t i = 0; i < N; i++) if (buf[i] != pat(i)) { printf("server: MISMATCH at %zu\n", i); return 1; }
    if (write(c, "ok", 2) != 2) return 1;
    char x;
    ssize_t e = read(c, &x, 1); /* the client closes: EOF */
    printf("server: %zu bytes match, then read %zd (EOF)\n", got, e);
    close(c); close(l);
    return e == 0 ? 0 : 1;
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
  for (size_t i = 0; i < N; i++) buf[i] = pat(i);
  size_t sent = 0;
  while (sent < N) { ssize_t r = send(c, buf + sent, N - sent, 0); if (r <= 0) { perror("send"); return 1; } sent += (size_t)r; }
  char r[3] = {0};
  size_t g = 0;
  while (g < 2) { ssize_t n = read(c, r + g, 2 - g); if (n <= 0) { perror("read"); return 1; } g += (size_t)n; }
  printf("client: sent %zu, reply %s\n", sent, r);
  close(c);
  return strcmp(r, "ok") != 0;
}
