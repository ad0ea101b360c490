/*
 * The sandbox's way out: a veth pair made with netlink by the init helper (root on the host), one end
 * ("eth0") inside the sandbox's network namespace, the other (HOSTIF) on the host. Both ends get a
 * /31 (host end: the gateway), the sandbox a default route through it. No process is started: a
 * handful of netlink messages, one socket per namespace (the sandbox's socket is made after a setns
 * into its namespace and back). Filtering and NAT are the host's nftables table (sandbox/network.ts).
 */
#ifndef SAP_NET_H
#define SAP_NET_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

struct sap_nlmsg {
  struct nlmsghdr h;
  char buf[1024];
};

static struct rtattr *sap_rta_add(struct nlmsghdr *h, unsigned short type, const void *data, size_t len) {
  struct rtattr *rta = (struct rtattr *)((char *)h + NLMSG_ALIGN(h->nlmsg_len));
  rta->rta_type = type;
  rta->rta_len = (unsigned short)RTA_LENGTH(len);
  if (len) memcpy(RTA_DATA(rta), data, len);
  h->nlmsg_len = NLMSG_ALIGN(h->nlmsg_len) + RTA_ALIGN(rta->rta_len);
  return rta;
}

static void sap_rta_end(struct nlmsghdr *h, struct rtattr *nest) {
  nest->rta_len = (unsigned short)((char *)h + h->nlmsg_len - (char *)nest);
}

/* Sends one request and reads its acknowledgement; returns 0 or -1 with errno set from the kernel's answer. */
static int sap_nl_call(int fd, struct nlmsghdr *h) {
  static unsigned seq;
  h->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
  h->nlmsg_seq = ++seq;
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  if (sendto(fd, h, h->nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) return -1;
  char buf[4096];
  for (;;) {
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    for (struct nlmsghdr *m = (struct nlmsghdr *)buf; NLMSG_OK(m, (unsigned)r); m = NLMSG_NEXT(m, r)) {
      if (m->nlmsg_seq != h->nlmsg_seq || m->nlmsg_type != NLMSG_ERROR) continue;
      int err = ((struct nlmsgerr *)NLMSG_DATA(m))->error;
      if (err == 0) return 0;
      errno = -err;
      return -1;
    }
  }
}

static void sap_nl_init(struct sap_nlmsg *m, unsigned short type, unsigned short flags, size_t body) {
  memset(m, 0, sizeof *m);
  m->h.nlmsg_len = (unsigned)NLMSG_LENGTH(body);
  m->h.nlmsg_type = type;
  m->h.nlmsg_flags = flags;
}

/* Deletes link `name` in the socket's namespace (a leftover of a dead sandbox); absent is fine. */
static int sap_link_del(int fd, const char *name) {
  struct sap_nlmsg m;
  sap_nl_init(&m, RTM_DELLINK, 0, sizeof(struct ifinfomsg));
  sap_rta_add(&m.h, IFLA_IFNAME, name, strlen(name) + 1);
  if (sap_nl_call(fd, &m.h) != 0 && errno != ENODEV) return -1;
  return 0;
}

/* A veth pair: `name` in the socket's namespace, `peer` in the namespace `peer_ns` (a descriptor). */
static int sap_veth_add(int fd, const char *name, const char *peer, int peer_ns) {
  struct sap_nlmsg m;
  sap_nl_init(&m, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct ifinfomsg));
  sap_rta_add(&m.h, IFLA_IFNAME, name, strlen(name) + 1);
  struct rtattr *info = sap_rta_add(&m.h, IFLA_LINKINFO, NULL, 0);
  sap_rta_add(&m.h, IFLA_INFO_KIND, "veth", 4);
  struct rtattr *data = sap_rta_add(&m.h, IFLA_INFO_DATA, NULL, 0);
  struct rtattr *p = sap_rta_add(&m.h, VETH_INFO_PEER, NULL, 0);
  struct ifinfomsg peer_info = {.ifi_family = AF_UNSPEC};
  /* The peer's ifinfomsg comes first, then its attributes. */
  memcpy((char *)&m + m.h.nlmsg_len, &peer_info, sizeof peer_info);
  m.h.nlmsg_len += (unsigned)NLMSG_ALIGN(sizeof peer_info);
  sap_rta_add(&m.h, IFLA_IFNAME, peer, strlen(peer) + 1);
  sap_rta_add(&m.h, IFLA_NET_NS_FD, &peer_ns, sizeof peer_ns);
  sap_rta_end(&m.h, p);
  sap_rta_end(&m.h, data);
  sap_rta_end(&m.h, info);
  return sap_nl_call(fd, &m.h);
}

static int sap_link_up(int fd, int index) {
  struct sap_nlmsg m;
  sap_nl_init(&m, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
  struct ifinfomsg *ifi = NLMSG_DATA(&m.h);
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = index;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  return sap_nl_call(fd, &m.h);
}

static int sap_addr_add(int fd, int index, struct in_addr addr, int prefix) {
  struct sap_nlmsg m;
  sap_nl_init(&m, RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, sizeof(struct ifaddrmsg));
  struct ifaddrmsg *ifa = NLMSG_DATA(&m.h);
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = (unsigned char)prefix;
  ifa->ifa_index = (unsigned)index;
  sap_rta_add(&m.h, IFA_LOCAL, &addr, sizeof addr);
  sap_rta_add(&m.h, IFA_ADDRESS, &addr, sizeof addr);
  return sap_nl_call(fd, &m.h);
}

static int sap_default_route(int fd, struct in_addr gw) {
  struct sap_nlmsg m;
  sap_nl_init(&m, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, sizeof(struct rtmsg));
  struct rtmsg *rt = NLMSG_DATA(&m.h);
  rt->rtm_family = AF_INET;
  rt->rtm_table = RT_TABLE_MAIN;
  rt->rtm_protocol = RTPROT_STATIC;
  rt->rtm_scope = RT_SCOPE_UNIVERSE;
  rt->rtm_type = RTN_UNICAST;
  sap_rta_add(&m.h, RTA_GATEWAY, &gw, sizeof gw);
  return sap_nl_call(fd, &m.h);
}

/* The index of interface `name`, asked through `sock` (a socket of that interface's namespace). */
static int sap_ifindex(int sock, const char *name) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
  if (ioctl(sock, SIOCGIFINDEX, &ifr) != 0) return -1;
  return ifr.ifr_ifindex;
}

/*
 * Connects the network namespace of process `pid` to the host: HOSTIF with `host`/31, eth0 with
 * `guest`/31 and a default route via `host`. Returns 0, or -1 with errno set and `what` naming the step.
 */
static int sap_connect_netns(int pid, const char *hostif, struct in_addr host, struct in_addr guest, int prefix, const char **what) {
  int rc = -1, own = -1, theirs = -1, nl_host = -1, nl_guest = -1, io_host = -1, io_guest = -1;
  char file[64];
  *what = "open namespaces";
  snprintf(file, sizeof file, "/proc/%d/ns/net", pid);
  if ((own = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC)) < 0 || (theirs = open(file, O_RDONLY | O_CLOEXEC)) < 0) goto out;
  *what = "netlink sockets";
  if ((nl_host = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE)) < 0) goto out;
  if ((io_host = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) goto out;
  if (setns(theirs, CLONE_NEWNET) != 0) goto out;
  nl_guest = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  io_guest = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (setns(own, CLONE_NEWNET) != 0) {
    /* Never carry on in the sandbox's namespace. */
    fprintf(stderr, "sap-sandbox-init: network: cannot return to the host's network namespace\n");
    _exit(1);
  }
  if (nl_guest < 0 || io_guest < 0) goto out;
  *what = "remove a leftover link";
  if (sap_link_del(nl_host, hostif) != 0) goto out;
  *what = "veth pair";
  if (sap_veth_add(nl_host, hostif, "eth0", theirs) != 0) goto out;
  int hi = sap_ifindex(io_host, hostif), gi = sap_ifindex(io_guest, "eth0");
  *what = "interface index";
  if (hi < 0 || gi < 0) goto out;
  *what = "host address";
  if (sap_addr_add(nl_host, hi, host, prefix) != 0) goto out;
  *what = "host link up";
  if (sap_link_up(nl_host, hi) != 0) goto out;
  *what = "sandbox address";
  if (sap_addr_add(nl_guest, gi, guest, prefix) != 0) goto out;
  *what = "sandbox link up";
  if (sap_link_up(nl_guest, gi) != 0) goto out;
  *what = "default route";
  if (sap_default_route(nl_guest, host) != 0) goto out;
  rc = 0;
out:;
  int e = errno;
  int fds[] = {own, theirs, nl_host, nl_guest, io_host, io_guest};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
    if (fds[i] >= 0) close(fds[i]);
  }
  errno = e;
  return rc;
}

#endif
