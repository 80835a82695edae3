# a tail call through an array map
#@ type kprobe
#@ intent reject
#@ map arr array 4 4 4
ldmap %r2, arr
mov %r3, 0
call 12
mov %r0, 0
exit
