# the offset goes in the load, not the pointer
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
exit
