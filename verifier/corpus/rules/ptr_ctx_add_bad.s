# the context pointer moved by a variable amount
#@ type kprobe
#@ intent reject
ldxdw %r2, [%r1+8]
and %r2, 8
add %r1, %r2
add %r1, -8
ldxdw %r0, [%r1+8]
exit
