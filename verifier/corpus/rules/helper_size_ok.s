# probe_read_user with a masked size into a 64-byte buffer
#@ type kprobe
#@ intent accept
ldxdw %r3, [%r1+112]
ldxdw %r2, [%r1+8]
and %r2, 63
mov %r1, %r10
add %r1, -64
call 112
mov %r0, 0
exit
