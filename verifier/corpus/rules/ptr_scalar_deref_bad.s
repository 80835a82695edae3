# a load through a number
#@ type kprobe
#@ intent reject
mov %r1, 4096
ldxdw %r0, [%r1]
exit
