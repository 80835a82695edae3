# both paths set r0
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
mov %r0, 1
jeq %r2, 0, out
mov %r0, 2
out:
exit
