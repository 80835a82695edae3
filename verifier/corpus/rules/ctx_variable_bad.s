# a variable offset into the context
#@ type kprobe
#@ intent reject
ldxdw %r2, [%r1+8]
and %r2, 8
add %r1, %r2
ldxdw %r0, [%r1]
exit
