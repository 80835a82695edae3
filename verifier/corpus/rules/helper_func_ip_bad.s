# get_func_ip of a stack pointer
#@ type kprobe
#@ intent reject
mov %r1, %r10
call 173
exit
