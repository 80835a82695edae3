# the context is only read
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
mov %r0, %r2
exit
