# shifting a 64-bit value by 64
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+8]
lsh %r0, 64
exit
