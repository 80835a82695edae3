# a map pointer passed untouched
#@ type kprobe
#@ intent accept
#@ map arr array 4 8 4
stw [%r10-4], 0
ldmap %r1, arr
mov %r2, %r10
add %r2, -4
call 1
mov %r0, 0
exit
