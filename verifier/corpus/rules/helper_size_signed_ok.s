# a size checked on both sides
#@ type kprobe
#@ intent accept
ldxdw %r3, [%r1+112]
ldxdw %r2, [%r1+8]
jsgt %r2, 32, out
jslt %r2, 0, out
mov %r1, %r10
add %r1, -32
call 112
out:
mov %r0, 0
exit
