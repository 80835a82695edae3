# r6-r9 survive a helper call
#@ type kprobe
#@ intent accept
mov %r6, 5
call 5
mov %r0, %r6
exit
