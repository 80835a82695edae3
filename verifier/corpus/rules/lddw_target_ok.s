# a branch over a 64-bit immediate
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
mov %r0, 0
jeq %r2, 0, +2
lddw %r0, 0x100000000
exit
