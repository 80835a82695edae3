# get_func_ip of the context
#@ type kprobe
#@ intent accept
call 173
exit
