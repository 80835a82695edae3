# an unwritten stack slot reads as a number, not a pointer
#@ type kprobe
#@ intent reject
ldxdw %r1, [%r10-8]
ldxdw %r0, [%r1]
exit
