# a negative context offset
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1-8]
exit
