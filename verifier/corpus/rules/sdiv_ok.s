# signed division by -1
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
sdiv %r0, -1
exit
