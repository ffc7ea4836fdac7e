from launcher.cli.entry import main

main()
