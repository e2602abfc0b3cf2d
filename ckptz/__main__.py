from ckptz.cli import main

main()
