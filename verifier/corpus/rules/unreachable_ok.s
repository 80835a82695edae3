# every instruction is reachable
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
mov %r0, 0
jeq %r2, 0, +1
mov %r0, 1
exit
