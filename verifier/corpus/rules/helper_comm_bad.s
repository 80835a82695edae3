# get_current_comm into a number
#@ type kprobe
#@ intent reject
mov %r1, 16
mov %r2, 16
call 16
mov %r0, 0
exit
