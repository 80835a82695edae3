# signed modulo by the constant zero
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+8]
smod %r0, 0
exit
