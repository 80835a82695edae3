# a size checked only from above may be negative
#@ type kprobe
#@ intent reject
ldxdw %r3, [%r1+112]
ldxdw %r2, [%r1+8]
jsgt %r2, 32, out
mov %r1, %r10
add %r1, -32
call 112
out:
mov %r0, 0
exit
