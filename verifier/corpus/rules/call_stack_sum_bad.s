# with a tail call, three frames share one stack: 3 x 256 bytes do not fit
#@ type kprobe
#@ intent reject
#@ map progs prog_array 4 4 4
mov %r6, %r1
stdw [%r10-256], 0
call local f
mov %r1, %r6
ldmap %r2, progs
mov %r3, 0
call 12
mov %r0, 0
exit
f:
stdw [%r10-256], 0
call local g
exit
g:
stdw [%r10-256], 0
mov %r0, 0
exit
