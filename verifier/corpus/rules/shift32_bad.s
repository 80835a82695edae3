# shifting a 32-bit value by 32
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+8]
rsh32 %r0, 32
exit
