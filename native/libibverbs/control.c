/* The control socket, the provider's side (docs/device-abi.md §1, §4): the runtime folder
 * found as the device finds it and checked to be this user's own, a SOCK_SEQPACKET connection
 * whose peer must be a process of this uid, and one request at a time with its reply checked
 * like any message from a peer, under a timeout. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "provider.h"

void pfr_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("libibverbs (pagefault-rdma): ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

int pfr_runtime_dir(char *out, size_t size)
{
	const char *own = getenv("PFR_DEVICE_DIR");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;
	if (own && *own)
		n = snprintf(out, size, "%s", own);
	else if (xdg && xdg[0] == '/')
		n = snprintf(out, size, "%s/pagefault-rdma", xdg);
	else
		n = snprintf(out, size, "/tmp/pagefault-rdma-%u", (unsigned)getuid());
	return n > 0 && (size_t)n < size ? 0 : ENAMETOOLONG;
}

static int default_timeout_ms(void)
{
	const char *s = getenv("PFR_DEVICE_TIMEOUT_MS");
	long v = s ? strtol(s, NULL, 10) : 0;
	return v > 0 && v < 3600000 ? (int)v : 10000;
}

/* The folder must be this user's and written by nobody else: a device found through another's
 * folder could be an impostor, and the provider lets its device into the program's memory. */
static int check_dir(const char *dir)
{
	struct stat st;
	if (lstat(dir, &st) != 0)
		return errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 022)) {
		pfr_warn("%s is not a folder of this user's that only it may write: no device there", dir);
		return EACCES;
	}
	return 0;
}

int pfr_connect(struct pfr_conn *c)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path) - 16];
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int err = pfr_runtime_dir(dir, sizeof(dir));
	if (err)
		return err;
	err = check_dir(dir);
	if (err)
		return err;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/device.sock", dir);
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return errno;
	if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
	    getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
		err = errno;
		close(c->fd);
		c->fd = -1;
		return err;
	}
	if (cred.uid != getuid()) {
		pfr_warn("the device at %s runs as uid %u, not as this user: not used", addr.sun_path, (unsigned)cred.uid);
		close(c->fd);
		c->fd = -1;
		return EACCES;
	}
	c->next_id = 1;
	c->timeout_ms = default_timeout_ms();
	c->dead = false;
	pthread_mutex_init(&c->lock, NULL);
	return 0;
}

void pfr_disconnect(struct pfr_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	pthread_mutex_destroy(&c->lock);
}

static int send_request(struct pfr_conn *c, uint16_t op, uint32_t id, const void *body, size_t len, const int *fds,
			int nfds)
{
	uint8_t buf[PFR_CTL_MAX_MESSAGE];
	struct pfr_ctl_hdr h = {.magic = PFR_CTL_MAGIC, .abi_version = PFR_ABI_VERSION, .op = op,
				.length = (uint32_t)(sizeof(h) + len), .request_id = id};
	union {
		char buf[CMSG_SPACE(sizeof(int) * PFR_CTL_MAX_FDS)];
		struct cmsghdr align;
	} control;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(h) + len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	if (sizeof(h) + len > sizeof(buf) || nfds > (int)PFR_CTL_MAX_FDS)
		return EINVAL;
	memcpy(buf, &h, sizeof(h));
	if (len)
		memcpy(buf + sizeof(h), body, len);
	if (nfds > 0) {
		struct cmsghdr *cm;
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	while (sendmsg(c->fd, &msg, MSG_NOSIGNAL) < 0)
		if (errno != EINTR)
			return errno == EPIPE || errno == ECONNRESET ? EIO : errno;
	return 0;
}

static void close_all(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* The reply to request `id`, checked: header fields, body size, descriptor count. */
static int receive_reply(struct pfr_conn *c, uint16_t op, uint32_t id, void *reply, size_t reply_len, int *rfds,
			 int nrfds)
{
	uint8_t buf[PFR_CTL_MAX_MESSAGE];
	union {
		char buf[CMSG_SPACE(sizeof(int) * PFR_CTL_MAX_FDS)];
		struct cmsghdr align;
	} control;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof(control.buf)};
	struct pollfd p = {.fd = c->fd, .events = POLLIN};
	struct pfr_ctl_hdr h;
	int got[PFR_CTL_MAX_FDS];
	int ngot = 0;
	ssize_t n;
	int r;
	while ((r = poll(&p, 1, c->timeout_ms)) < 0 && errno == EINTR)
		;
	if (r == 0)
		return ETIMEDOUT;
	while ((n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	if (n <= 0)
		return EIO; /* the device went away */
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k && ngot < (int)PFR_CTL_MAX_FDS; i++)
				memcpy(&got[ngot++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
		}
	if ((size_t)n < sizeof(h) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		goto broken;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != PFR_CTL_MAGIC || h.abi_version != PFR_ABI_VERSION || h.op != op || h.request_id != id ||
	    h.length != (uint32_t)n || h.flags != PFR_CTL_REPLY || h.status > 0)
		goto broken;
	if (h.status < 0) {
		close_all(got, ngot);
		return h.status == INT32_MIN ? EIO : -h.status;
	}
	if ((size_t)n - sizeof(h) != reply_len || ngot != nrfds)
		goto broken;
	if (reply_len)
		memcpy(reply, buf + sizeof(h), reply_len);
	memcpy(rfds, got, sizeof(int) * (size_t)ngot);
	return 0;
broken:
	close_all(got, ngot);
	pfr_warn("the device broke the protocol (op %u): the context is unusable", (unsigned)op);
	return EIO;
}

int pfr_call(struct pfr_conn *c, uint16_t op, const void *body, size_t len, const int *fds, int nfds, void *reply,
	     size_t reply_len, int *rfds, int nrfds)
{
	int err;
	uint32_t id;
	pthread_mutex_lock(&c->lock);
	if (c->dead) {
		pthread_mutex_unlock(&c->lock);
		return EIO;
	}
	id = c->next_id++;
	err = send_request(c, op, id, body, len, fds, nfds);
	if (!err)
		err = receive_reply(c, op, id, reply, reply_len, rfds, nrfds);
	if (err == EIO || err == ETIMEDOUT)
		c->dead = true; /* a late reply would be taken for the next request's */
	pthread_mutex_unlock(&c->lock);
	return err;
}

int pfr_call_handle(struct pfr_conn *c, uint16_t op, const void *body, size_t len, const int *fds, int nfds,
		    uint32_t *handle)
{
	struct pfr_handle h;
	int err = pfr_call(c, op, body, len, fds, nfds, &h, sizeof(h), NULL, 0);
	if (!err)
		*handle = h.handle;
	return err;
}

int pfr_call_on(struct pfr_conn *c, uint16_t op, uint32_t handle, void *reply, size_t reply_len)
{
	struct pfr_handle h = {.handle = handle};
	return pfr_call(c, op, &h, sizeof(h), NULL, 0, reply, reply_len, NULL, 0);
}
