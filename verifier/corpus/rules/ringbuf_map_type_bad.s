# reserve from an array map
#@ type kprobe
#@ intent reject
#@ map arr array 4 8 4
ldmap %r1, arr
mov %r2, 8
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r1, %r0
mov %r2, 0
call 133
out:
mov %r0, 0
exit
