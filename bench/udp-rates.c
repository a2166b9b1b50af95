/*
 * UDP send and receive rates on loopback, for docs/architecture.md ("The datagram path"): 1400-byte datagrams sent
 * with sendmmsg (64 per call) or UDP GSO (UDP_SEGMENT, 46 per call), received with recvmmsg (64 per call), with or
 * without UDP_GRO. Loopback only (127.0.0.1:47002); each side stops after the given seconds.
 *
 *   gcc -O2 -o /tmp/udp-rates bench/udp-rates.c
 *   /tmp/udp-rates recv 3 [gro] &  /tmp/udp-rates mmsg 3     (or: gso 3)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  const char*mode=argv[1]; double secs=atof(argv[2]); int seg=1400;
  struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(47002)}; inet_pton(AF_INET,"127.0.0.1",&a.sin_addr);
  int fd=socket(AF_INET,SOCK_DGRAM,0); int big=16<<20;
  setsockopt(fd,SOL_SOCKET,SO_RCVBUF,&big,4); setsockopt(fd,SOL_SOCKET,SO_SNDBUF,&big,4);
  if(strcmp(mode,"recv")==0){ int gro=argc>3; bind(fd,(void*)&a,sizeof a); if(gro){int one=1;setsockopt(fd,IPPROTO_UDP,UDP_GRO,&one,4);}
    struct timeval tv={0,200000}; setsockopt(fd,SOL_SOCKET,SO_RCVTIMEO,&tv,sizeof tv);
    static char bufs[64][65536]; struct mmsghdr m[64]; struct iovec io[64];
    for(int i=0;i<64;i++){io[i].iov_base=bufs[i];io[i].iov_len=65536;memset(&m[i],0,sizeof m[i]);m[i].msg_hdr.msg_iov=&io[i];m[i].msg_hdr.msg_iovlen=1;}
    long bytes=0,calls=0; double t0=0,end=0;
    for(;;){int n=recvmmsg(fd,m,64,0,NULL); if(n<=0){ if(t0&&now()>end) break; if(t0&&now()>t0+secs+1)break; continue;} if(!t0){t0=now();end=t0+secs;} calls++; for(int i=0;i<n;i++)bytes+=m[i].msg_len; if(now()>end)break;}
    double dt=now()-t0; printf("rx%s: %.2f Gbit/s, %.0f kpps of %d B, %ld recvmmsg calls\n",gro?" GRO":"",bytes*8/dt/1e9,bytes/(double)seg/dt/1000,seg,calls);
  } else { connect(fd,(void*)&a,sizeof a); int gso=strcmp(mode,"gso")==0; static char buf[64*1400]; long sent=0,calls=0; double end=now()+secs;
    if(gso){ int s=seg; setsockopt(fd,IPPROTO_UDP,UDP_SEGMENT,&s,4);
      while(now()<end){ ssize_t n=send(fd,buf,46*seg,0); if(n>0){sent+=n;calls++;} } }
    else { struct mmsghdr m[64]; struct iovec io[64]; for(int i=0;i<64;i++){io[i].iov_base=buf+i*seg;io[i].iov_len=seg;memset(&m[i],0,sizeof m[i]);m[i].msg_hdr.msg_iov=&io[i];m[i].msg_hdr.msg_iovlen=1;}
      while(now()<end){ int n=sendmmsg(fd,m,64,0); if(n>0){sent+=(long)n*seg;calls++;} } }
    printf("tx %s: %.2f Gbit/s offered, %ld calls\n",gso?"UDP GSO 46x1400":"sendmmsg 64x1400",sent*8/secs/1e9,calls);
  }
  return 0;}
