# masking a scalar
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
and %r2, 0xff
mov %r0, %r2
exit
