// SPDX-License-Identifier: MIT
/*
 * tls_pair: a target for tools that trace OpenSSL (bpftrace's sslsnoop.bt and
 * ssllatency.bt): a TLS 1.2 client and server in two threads of one process, over a
 * socketpair, with a fresh self-signed RSA certificate.
 *
 * It prints `pid=PID` once its keys are made, waits for a line on stdin (so a tool can
 * attach to it by pid first), then runs one handshake (SSL_do_handshake on each side;
 * ECDHE-RSA with an RSA PKCS#1 signature: RSA_sign on the server, RSA_verify on the
 * client) and N rounds of a 16-byte request and a 16-byte reply (SSL_write and SSL_read
 * on each side), prints `rounds=N`, and exits 0 at the next line on stdin (or its
 * end): a tool that names the functions it saw from their addresses reads this
 * process's maps after the events. The calls of the probed functions are
 * the same in every run: one record per message, blocking sockets, no session tickets.
 *
 * Usage: tls_pair N
 */
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG 16

static long rounds;

static void die(const char *what)
{
	fprintf(stderr, "tls_pair: %s failed\n", what);
	ERR_print_errors_fp(stderr);
	exit(1);
}

static SSL_CTX *context(const SSL_METHOD *method)
{
	SSL_CTX *ctx = SSL_CTX_new(method);

	if (!ctx)
		die("SSL_CTX_new");
	if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
	    !SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION) ||
	    !SSL_CTX_set_cipher_list(ctx, "ECDHE-RSA-AES128-GCM-SHA256") ||
	    !SSL_CTX_set1_sigalgs_list(ctx, "RSA+SHA256"))
		die("configuring the context");
	SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
	return ctx;
}

static void exchange(SSL *ssl, int server)
{
	char buf[MSG + 1], msg[MSG + 1];

	if (SSL_do_handshake(ssl) != 1)
		die("SSL_do_handshake");
	for (long i = 0; i < rounds; i++) {
		snprintf(msg, sizeof(msg), "%s %011d", server ? "pong" : "ping", (int)(i % 100000));
		if (server) {
			if (SSL_read(ssl, buf, MSG) != MSG)
				die("SSL_read");
			if (SSL_write(ssl, msg, MSG) != MSG)
				die("SSL_write");
		} else {
			if (SSL_write(ssl, msg, MSG) != MSG)
				die("SSL_write");
			if (SSL_read(ssl, buf, MSG) != MSG)
				die("SSL_read");
		}
	}
}

static void *serve(void *ssl)
{
	exchange(ssl, 1);
	return NULL;
}

int main(int argc, char **argv)
{
	rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 1;

	EVP_PKEY *key = EVP_RSA_gen(2048);
	X509 *cert = X509_new();

	if (!key || !cert)
		die("making a key");
	ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
	X509_gmtime_adj(X509_getm_notBefore(cert), 0);
	X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
	X509_set_pubkey(cert, key);
	X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
				   (const unsigned char *)"localhost", -1, -1, 0);
	X509_set_issuer_name(cert, X509_get_subject_name(cert));
	if (!X509_sign(cert, key, EVP_sha256()))
		die("X509_sign");

	SSL_CTX *sctx = context(TLS_server_method());
	SSL_CTX *cctx = context(TLS_client_method());

	if (SSL_CTX_use_certificate(sctx, cert) != 1 || SSL_CTX_use_PrivateKey(sctx, key) != 1)
		die("installing the certificate");
	SSL_CTX_set_verify(cctx, SSL_VERIFY_NONE, NULL);

	int fds[2];

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds))
		die("socketpair");
	SSL *server = SSL_new(sctx), *client = SSL_new(cctx);

	if (!server || !client || !SSL_set_fd(server, fds[0]) || !SSL_set_fd(client, fds[1]))
		die("SSL_new");
	SSL_set_accept_state(server);
	SSL_set_connect_state(client);

	printf("pid=%d\n", getpid());
	fflush(stdout);
	char line[64];

	if (!fgets(line, sizeof(line), stdin))
		return 2;

	pthread_t t;

	if (pthread_create(&t, NULL, serve, server))
		die("pthread_create");
	exchange(client, 0);
	pthread_join(t, NULL);
	printf("rounds=%ld\n", rounds);
	fflush(stdout);
	(void)!fgets(line, sizeof(line), stdin);
	SSL_free(client);
	SSL_free(server);
	SSL_CTX_free(cctx);
	SSL_CTX_free(sctx);
	X509_free(cert);
	EVP_PKEY_free(key);
	return 0;
}
