# probe_read_user with a size that is not bounded
#@ type kprobe
#@ intent reject
ldxdw %r3, [%r1+112]
ldxdw %r2, [%r1+8]
mov %r1, %r10
add %r1, -64
call 112
mov %r0, 0
exit
