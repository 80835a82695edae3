# jne: the pointer is used on the non-null side
#@ type kprobe
#@ intent accept
#@ map h hash 4 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
jne %r0, 0, use
mov %r0, 0
exit
use:
ldxdw %r0, [%r0]
exit
