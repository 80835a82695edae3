# r1-r5 do not survive a helper call
#@ type kprobe
#@ intent reject
mov %r1, 5
call 5
mov %r0, %r1
exit
