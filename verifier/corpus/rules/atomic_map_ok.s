# an atomic add on a map value
#@ type kprobe
#@ intent accept
#@ map arr array 4 8 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, arr
call 1
jeq %r0, 0, out
mov %r1, 1
lock add [%r0], %r1
out:
mov %r0, 0
exit
