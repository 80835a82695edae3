# offset 0 is the first field
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1]
exit
