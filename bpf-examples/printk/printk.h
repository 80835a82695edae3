/* SPDX-License-Identifier: MIT */
/* What printk.bpf.c prints for each call of the probed function f(arg):
 *
 *   "call arg=<arg>"                         bpf_trace_printk, no newline
 *   "four <arg> <arg+1> <arg+2> <arg+3>\n"   bpf_trace_vprintk (more than
 *                                            three arguments), with a newline
 *                                            of its own, as many tools write
 */
#ifndef PRINTK_H
#define PRINTK_H

#define PRINTK_LINES_PER_CALL 2

#endif /* PRINTK_H */
