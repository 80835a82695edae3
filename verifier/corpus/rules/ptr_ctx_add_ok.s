# the context pointer moved back to its start is usable
#@ type kprobe
#@ intent accept
add %r1, 8
add %r1, -8
ldxdw %r0, [%r1+8]
exit
