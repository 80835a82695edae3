// SPDX-License-Identifier: MIT
/*
 * lookups: a target for tools that trace libc's name lookups (libbpf-tools'
 * gethostlatency): N rounds of getaddrinfo("localhost") and gethostbyname("localhost"),
 * then exits 0. Nothing is printed.
 *
 * Usage: lookups N
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? strtol(argv[1], NULL, 10) : 1;

	for (long i = 0; i < n; i++) {
		struct addrinfo *r = NULL;

		if (getaddrinfo("localhost", "80", NULL, &r) == 0)
			freeaddrinfo(r);
		if (!gethostbyname("localhost"))
			fprintf(stderr, "lookups: gethostbyname failed\n");
	}
	return 0;
}
