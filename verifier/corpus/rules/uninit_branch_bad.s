# only one path sets r0
#@ type kprobe
#@ intent reject
ldxdw %r2, [%r1+8]
jeq %r2, 0, out
mov %r0, 2
out:
exit
